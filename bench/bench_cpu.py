#!/usr/bin/env python3
"""CPU backend benchmarks: `kiln bench` against baselines measured in the same run.

  (a) chain    a 10-op elementwise chain over 16M f32, against a hand-written
               C triad kernel's bandwidth (compiled here with -O3
               -march=native), NumPy evaluating the same expression, and
               jax.jit of it on JAX's CPU backend;
  (b) dot      a 2048x2048 f32 matrix product, against one direct OpenBLAS
               cblas_sgemm call, NumPy's matmul and jax.jit;
  (c) mlp      an MLP forward pass (batch 256, 784->1024->1024->10, bias,
               relu, softmax), against NumPy and jax.jit, and kiln's peak
               bytes against the smallest set of bytes that must be live;
  (d) compile  cold compile time of that MLP (a fresh `kiln bench` process
               each time), split into passes, code generation and the C
               compiler.

Each benchmark runs --rounds rounds; in each round every contender is timed
--iters times (after one warm-up) and the round keeps the medians; the
figures printed are medians over the rounds, the ratios computed per round
and then their median. One JSON line per benchmark goes to stdout, progress
to stderr. Nothing here is part of the test suite.

    python bench/bench_cpu.py [--kiln build/kiln] [--rounds 5] [--only chain,dot]

NumPy and JAX come from the Python running this script; without JAX the JAX
figures are null.

OpenBLAS: kiln and the cblas_sgemm baseline use the system library, NumPy its
own bundled one. An OpenBLAS older than the CPU falls back to generic kernels;
kiln then re-executes itself with OPENBLAS_CORETYPE set to the core the CPU's
features call for (executor/cpu/cpu_blas.h), and by default (--openblas-coretype
auto) the baseline library is loaded with the same choice, so that both sides
of the dot ratio run the same kernels. The meta line records what the library
detected on its own and what each side ran.
"""

import argparse
import ctypes
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time

import numpy as np

try:
    os.environ.setdefault("JAX_PLATFORMS", "cpu")
    import jax
    import jax.numpy as jnp
except ImportError:  # pragma: no cover - depends on the environment
    jax = None

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def log(*a):
    print(*a, file=sys.stderr, flush=True)


def median(v):
    return statistics.median(v) if v else None


def timed(fn, iters, best=None):
    """Seconds per call: one warm-up, then the median of `iters` calls (the
    fastest call is appended to the list `best` when given)."""
    fn()
    out = []
    for _ in range(iters):
        t0 = time.perf_counter()
        fn()
        out.append(time.perf_counter() - t0)
    if best is not None:
        best.append(min(out))
    return median(out)


def kiln_bench(kiln, path, iters, extra=()):
    cmd = [kiln, "bench", path, "--iters", str(iters)] + list(extra)
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=1800, env=KILN_ENV or None)
    if p.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed ({p.returncode}): {p.stderr}")
    return json.loads(p.stdout)


ENV_AT_START = dict(os.environ)
KILN_ENV = {}


def cpu_blas_tier():
    """2 with AVX-512 (F, CD, BW, DQ, VL), 1 with AVX2 and FMA, else 0: the
    rule of kiln_cpu_blas_better_core."""
    try:
        flags = next(l for l in open("/proc/cpuinfo") if l.startswith("flags")).split()
    except (OSError, StopIteration):
        return 0
    if all(f in flags for f in ("avx512f", "avx512cd", "avx512bw", "avx512dq", "avx512vl")):
        return 2
    return 1 if "avx2" in flags and "fma" in flags else 0


def openblas_cores(option):
    """(core the system OpenBLAS detects on its own, OPENBLAS_CORETYPE to use
    or None). Probed in a child process: the variable only counts before the
    library loads."""
    probe = ("import ctypes, ctypes.util; l = ctypes.CDLL(ctypes.util.find_library('openblas') "
             "or 'libopenblas.so.0'); f = l.openblas_get_corename; f.restype = ctypes.c_char_p; "
             "print(f().decode())")
    env = {k: v for k, v in os.environ.items() if k != "OPENBLAS_CORETYPE"}
    p = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, env=env)
    detected = p.stdout.strip() or None
    if option == "none":
        return detected, os.environ.get("OPENBLAS_CORETYPE")
    if option != "auto":
        return detected, option
    if "OPENBLAS_CORETYPE" in os.environ:
        return detected, os.environ["OPENBLAS_CORETYPE"]
    tiers = {"skylakex": 2, "cooperlake": 2, "sapphirerapids": 2, "haswell": 1, "zen": 1}
    want = cpu_blas_tier()
    if detected is None or want == 0 or tiers.get(detected.lower(), 0) >= want:
        return detected, None
    return detected, "SkylakeX" if want == 2 else "Haswell"


def build_baselines(tmp):
    """Compiles baseline_kernels.c with -O3 -march=native; the ctypes library."""
    src = os.path.join(ROOT, "bench", "baseline_kernels.c")
    so = os.path.join(tmp, "baseline_kernels.so")
    flags = subprocess.run(["pkg-config", "--cflags", "--libs", "openblas"], capture_output=True,
                           text=True).stdout.split() or ["-lopenblas"]
    cmd = ["cc", "-O3", "-march=native", "-shared", "-fPIC", src, "-o", so, "-lpthread"] + flags
    subprocess.run(cmd, check=True)
    lib = ctypes.CDLL(so)
    fp = ctypes.POINTER(ctypes.c_float)
    lib.kiln_bench_triad.argtypes = [fp, fp, fp, ctypes.c_float, ctypes.c_int64, ctypes.c_int]
    lib.kiln_bench_triad.restype = None
    lib.kiln_bench_sgemm.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_int, fp, fp, fp]
    lib.kiln_bench_sgemm.restype = None
    return lib, " ".join(cmd)


def ptr(a):
    return a.ctypes.data_as(ctypes.POINTER(ctypes.c_float))


def threads():
    return len(os.sched_getaffinity(0))


# ---- programs: HLO text, and the same function for NumPy and JAX ----------

def chain_hlo(n):
    return f"""HloModule chain

ENTRY chain {{
  x = f32[{n}] parameter(0)
  y = f32[{n}] parameter(1)
  c_half = f32[] constant(0.5)
  c_two = f32[] constant(2)
  c_one = f32[] constant(1)
  half = f32[{n}] broadcast(c_half), dimensions={{}}
  two = f32[{n}] broadcast(c_two), dimensions={{}}
  one = f32[{n}] broadcast(c_one), dimensions={{}}
  a1 = f32[{n}] multiply(x, y)
  a2 = f32[{n}] add(a1, x)
  a3 = f32[{n}] multiply(a2, half)
  a4 = f32[{n}] subtract(a3, y)
  a5 = f32[{n}] maximum(a4, x)
  a6 = f32[{n}] multiply(a5, a5)
  a7 = f32[{n}] add(a6, y)
  a8 = f32[{n}] minimum(a7, two)
  a9 = f32[{n}] multiply(a8, x)
  ROOT a10 = f32[{n}] add(a9, one)
}}
"""


def chain_fn(xp):
    def f(x, y):
        a = x * y
        a = a + x
        a = a * np.float32(0.5)
        a = a - y
        a = xp.maximum(a, x)
        a = a * a
        a = a + y
        a = xp.minimum(a, np.float32(2))
        a = a * x
        return a + np.float32(1)
    return f


def dot_hlo(n):
    return f"""HloModule dot

ENTRY dot {{
  a = f32[{n},{n}] parameter(0)
  b = f32[{n},{n}] parameter(1)
  ROOT c = f32[{n},{n}] dot(a, b), lhs_contracting_dims={{1}}, rhs_contracting_dims={{0}}
}}
"""


MLP = dict(batch=256, din=784, h1=1024, h2=1024, dout=10)


def mlp_hlo(batch, din, h1, h2, dout):
    def layer(i, x, k, n, relu):
        s = f"""  w{i} = f32[{k},{n}] parameter({2 * i - 1})
  b{i} = f32[{n}] parameter({2 * i})
  d{i} = f32[{batch},{n}] dot({x}, w{i}), lhs_contracting_dims={{1}}, rhs_contracting_dims={{0}}
  bb{i} = f32[{batch},{n}] broadcast(b{i}), dimensions={{1}}
  z{i} = f32[{batch},{n}] add(d{i}, bb{i})
"""
        if relu:
            s += f"""  zero{i} = f32[{batch},{n}] broadcast(c0), dimensions={{}}
  h{i} = f32[{batch},{n}] maximum(z{i}, zero{i})
"""
        return s
    return f"""HloModule mlp

max_f32 {{
  a = f32[] parameter(0)
  b = f32[] parameter(1)
  ROOT m = f32[] maximum(a, b)
}}

add_f32 {{
  a = f32[] parameter(0)
  b = f32[] parameter(1)
  ROOT s = f32[] add(a, b)
}}

ENTRY mlp {{
  x = f32[{batch},{din}] parameter(0)
  c0 = f32[] constant(0)
  ninf = f32[] constant(-inf)
{layer(1, "x", din, h1, True)}{layer(2, "h1", h1, h2, True)}{layer(3, "h2", h2, dout, False)}  m = f32[{batch}] reduce(z3, ninf), dimensions={{1}}, to_apply=max_f32
  mb = f32[{batch},{dout}] broadcast(m), dimensions={{0}}
  s = f32[{batch},{dout}] subtract(z3, mb)
  e = f32[{batch},{dout}] exponential(s)
  sum = f32[{batch}] reduce(e, c0), dimensions={{1}}, to_apply=add_f32
  sb = f32[{batch},{dout}] broadcast(sum), dimensions={{0}}
  ROOT p = f32[{batch},{dout}] divide(e, sb)
}}
"""


def mlp_fn(xp):
    def f(x, w1, b1, w2, b2, w3, b3):
        h = xp.maximum(x @ w1 + b1, np.float32(0))
        h = xp.maximum(h @ w2 + b2, np.float32(0))
        z = h @ w3 + b3
        e = xp.exp(z - z.max(axis=1, keepdims=True))
        return e / e.sum(axis=1, keepdims=True)
    return f


def mlp_args(rng, batch, din, h1, h2, dout):
    u = lambda *s: rng.uniform(-1, 1, s).astype(np.float32)
    return [u(batch, din), u(din, h1) * 0.05, u(h1), u(h1, h2) * 0.05, u(h2), u(h2, dout) * 0.05,
            u(dout)]


def jax_timed(fn, args, iters):
    if jax is None:
        return None
    f = jax.jit(fn)
    dev = [jnp.asarray(a) for a in args]
    f(*dev).block_until_ready()  # compile
    return timed(lambda: f(*dev).block_until_ready(), iters)


def ratio(a, b):
    return None if a is None or b is None or b == 0 else a / b


# ---- the benchmarks ---------------------------------------------------------

def bench_chain(o, lib, tmp):
    n = o.chain_n
    path = os.path.join(tmp, "chain.hlo")
    open(path, "w").write(chain_hlo(n))
    rng = np.random.default_rng(0)
    x, y = (rng.uniform(-1, 1, n).astype(np.float32) for _ in range(2))
    a = np.empty_like(x)
    nbytes = 3 * 4 * n  # two inputs read, one output written, by both programs
    rows = []
    for r in range(o.rounds):
        k = kiln_bench(o.kiln, path, o.iters)
        t_kiln = k["run_us_median"] / 1e6
        t_triad = timed(lambda: lib.kiln_bench_triad(ptr(a), ptr(x), ptr(y), np.float32(0.5), n,
                                                     threads()), o.iters)
        t_np = timed(lambda: chain_fn(np)(x, y), o.iters)
        t_jax = jax_timed(chain_fn(jnp) if jax else None, [x, y], o.iters) if jax else None
        rows.append(dict(kiln=t_kiln, triad=t_triad, numpy=t_np, jax=t_jax,
                         compile_ms=k["compile_ms"]))
        log(f"chain round {r}: kiln {t_kiln * 1e3:.2f} ms, triad {t_triad * 1e3:.2f} ms, "
            f"numpy {t_np * 1e3:.2f} ms, jax {t_jax and t_jax * 1e3:.2f} ms")
    med = lambda key: median([row[key] for row in rows if row[key] is not None])
    rmed = lambda f: median([v for v in (f(row) for row in rows) if v is not None])
    return {
        "bench": "elementwise_chain", "n": n, "ops": 10, "dtype": "f32",
        "kiln_ms": med("kiln") * 1e3, "kiln_gb_s": nbytes / med("kiln") / 1e9,
        "triad_ms": med("triad") * 1e3, "triad_gb_s": nbytes / med("triad") / 1e9,
        "numpy_ms": med("numpy") * 1e3, "jax_ms": med("jax") and med("jax") * 1e3,
        "kiln_bandwidth_vs_triad": rmed(lambda r: ratio(r["triad"], r["kiln"])),
        "kiln_speedup_vs_numpy": rmed(lambda r: ratio(r["numpy"], r["kiln"])),
        "kiln_speedup_vs_jax": rmed(lambda r: ratio(r["jax"], r["kiln"])),
        "kiln_compile_ms": med("compile_ms"),
    }


def bench_dot(o, lib, tmp):
    n = o.dot_n
    path = os.path.join(tmp, "dot.hlo")
    open(path, "w").write(dot_hlo(n))
    rng = np.random.default_rng(1)
    a, b = (rng.uniform(-1, 1, (n, n)).astype(np.float32) for _ in range(2))
    c = np.empty_like(a)
    flop = 2.0 * n ** 3
    rows = []
    for r in range(o.rounds):
        k = kiln_bench(o.kiln, path, o.dot_iters)
        t_kiln = k["run_us_median"] / 1e6
        t_blas = timed(lambda: lib.kiln_bench_sgemm(n, n, n, ptr(a), ptr(b), ptr(c)), o.dot_iters)
        t_np = timed(lambda: a @ b, o.dot_iters)
        t_jax = jax_timed(lambda p, q: p @ q, [a, b], o.dot_iters)
        rows.append(dict(kiln=t_kiln, blas=t_blas, numpy=t_np, jax=t_jax))
        log(f"dot round {r}: kiln {t_kiln * 1e3:.1f} ms, openblas {t_blas * 1e3:.1f} ms, "
            f"numpy {t_np * 1e3:.1f} ms, jax {t_jax and t_jax * 1e3:.1f} ms")
    med = lambda key: median([row[key] for row in rows if row[key] is not None])
    rmed = lambda f: median([v for v in (f(row) for row in rows) if v is not None])
    return {
        "bench": "dot", "m": n, "n": n, "k": n, "dtype": "f32",
        "kiln_ms": med("kiln") * 1e3, "kiln_gflop_s": flop / med("kiln") / 1e9,
        "openblas_ms": med("blas") * 1e3, "openblas_gflop_s": flop / med("blas") / 1e9,
        "numpy_ms": med("numpy") * 1e3, "jax_ms": med("jax") and med("jax") * 1e3,
        "kiln_vs_openblas": rmed(lambda r: ratio(r["blas"], r["kiln"])),
        "kiln_vs_numpy": rmed(lambda r: ratio(r["numpy"], r["kiln"])),
        "kiln_vs_jax": rmed(lambda r: ratio(r["jax"], r["kiln"])),
    }


def mlp_min_live_bytes(batch, din, h1, h2, dout):
    """Parameters and the output are live throughout; on top of them the
    second layer's matrix product must hold its input and its output at
    once, the largest pair of activations any schedule needs."""
    params = 4 * (batch * din + din * h1 + h1 + h1 * h2 + h2 + h2 * dout + dout)
    out = 4 * batch * dout
    return params + out + 4 * batch * max(h1 + h2, h2 + dout)


def bench_mlp(o, lib, tmp):
    path = os.path.join(tmp, "mlp.hlo")
    open(path, "w").write(mlp_hlo(**MLP))
    args = mlp_args(np.random.default_rng(2), **MLP)
    rows, peak, kiln_best, np_best = [], None, [], []
    for r in range(o.rounds):
        k = kiln_bench(o.kiln, path, o.iters)
        peak = k
        t_kiln = k["run_us_median"] / 1e6
        kiln_best.append(k["run_us_min"] / 1e6)
        t_np = timed(lambda: mlp_fn(np)(*args), o.iters, np_best)
        t_jax = jax_timed(mlp_fn(jnp) if jax else None, args, o.iters) if jax else None
        rows.append(dict(kiln=t_kiln, numpy=t_np, jax=t_jax))
        log(f"mlp round {r}: kiln {t_kiln * 1e3:.2f} ms, numpy {t_np * 1e3:.2f} ms, "
            f"jax {t_jax and t_jax * 1e3:.2f} ms")
    med = lambda key: median([row[key] for row in rows if row[key] is not None])
    rmed = lambda f: median([v for v in (f(row) for row in rows) if v is not None])
    min_live = mlp_min_live_bytes(**MLP)
    return {
        "bench": "mlp_forward", **MLP, "dtype": "f32",
        "kiln_ms": med("kiln") * 1e3, "numpy_ms": med("numpy") * 1e3,
        "jax_ms": med("jax") and med("jax") * 1e3,
        "kiln_speedup_vs_numpy": rmed(lambda r: ratio(r["numpy"], r["kiln"])),
        "kiln_speedup_vs_jax": rmed(lambda r: ratio(r["jax"], r["kiln"])),
        # The fastest single run of each over all rounds: what a quiet
        # machine gives, where medians on a shared one measure its load too.
        "kiln_best_ms": min(kiln_best) * 1e3, "numpy_best_ms": min(np_best) * 1e3,
        "kiln_speedup_vs_numpy_best": min(np_best) / min(kiln_best),
        "peak_bytes": peak["peak_bytes"], "temp_peak_bytes": peak["temp_peak_bytes"],
        "min_live_bytes": min_live, "peak_vs_min_live": peak["peak_bytes"] / min_live,
    }


def bench_compile(o, lib, tmp):
    path = os.path.join(tmp, "mlp.hlo")
    open(path, "w").write(mlp_hlo(**MLP))
    runs = [kiln_bench(o.kiln, path, 1) for _ in range(o.compile_runs)]
    med = lambda f: median([f(r) for r in runs])
    passes = sorted({p for r in runs for p in r["passes_ms"]})
    out = {
        "bench": "compile_mlp", "runs": len(runs),
        "compile_ms": med(lambda r: r["compile_ms"]),
        "verify_ms": med(lambda r: r["verify_ms"]),
        "pipeline_ms": med(lambda r: r["pipeline_ms"]),
        "passes_ms": {p: med(lambda r: r["passes_ms"].get(p, 0.0)) for p in passes},
        "assign_ms": med(lambda r: r["assign_ms"]),
        "codegen_ms": med(lambda r: r["codegen_ms"]),
        "cc_ms": med(lambda r: r["cc_ms"]),
    }
    out["cc_share"] = out["cc_ms"] / out["compile_ms"]
    log(f"compile: {out['compile_ms']:.1f} ms, of which C compiler {out['cc_ms']:.1f} ms")
    return out


BENCHES = {"chain": bench_chain, "dot": bench_dot, "mlp": bench_mlp, "compile": bench_compile}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--kiln", default=os.environ.get("KILN_BIN") or
                    os.path.join(ROOT, "build", "kiln"))
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--iters", type=int, default=10, help="timed runs per contender per round")
    ap.add_argument("--dot-iters", type=int, default=5)
    ap.add_argument("--compile-runs", type=int, default=7)
    ap.add_argument("--chain-n", type=int, default=16 * 1024 * 1024)
    ap.add_argument("--dot-n", type=int, default=2048)
    ap.add_argument("--only", default=",".join(BENCHES))
    ap.add_argument("--openblas-coretype", default="auto",
                    help="OPENBLAS_CORETYPE for the OpenBLAS baseline: 'auto' (default) picks the "
                         "core kiln itself selects at start (executor/cpu/cpu_blas.h), 'none' "
                         "leaves the library's own detection, any other value is set for the "
                         "baseline and for kiln")
    o = ap.parse_args()
    detected, chosen = openblas_cores(o.openblas_coretype)
    # Before the baseline library loads. kiln gets the same variable only when
    # it was given explicitly: on 'auto' it makes the same choice itself.
    if chosen:
        os.environ["OPENBLAS_CORETYPE"] = chosen
    kiln_env = dict(os.environ)
    if o.openblas_coretype == "auto" and "OPENBLAS_CORETYPE" not in ENV_AT_START:
        kiln_env.pop("OPENBLAS_CORETYPE", None)
    KILN_ENV.update(kiln_env)
    if not os.path.exists(o.kiln):
        sys.exit(f"bench_cpu: no kiln binary at {o.kiln} (--kiln or KILN_BIN)")
    with tempfile.TemporaryDirectory(prefix="kiln_bench_") as tmp:
        lib, cc_cmd = build_baselines(tmp)
        meta = {"bench": "meta", "date_utc": time.strftime("%Y-%m-%d %H:%M", time.gmtime()),
                "machine": platform.processor() or platform.machine(), "cores": threads(),
                "loadavg_start": os.getloadavg()[0], "numpy": np.__version__,
                "jax": jax.__version__ if jax else None, "baseline_cc": cc_cmd,
                "rounds": o.rounds, "iters": o.iters,
                "openblas_core_detected": detected,
                "openblas_coretype_baseline": os.environ.get("OPENBLAS_CORETYPE"),
                "openblas_coretype_kiln": KILN_ENV.get("OPENBLAS_CORETYPE", "auto")}
        print(json.dumps(meta), flush=True)
        for name in o.only.split(","):
            print(json.dumps(BENCHES[name](o, lib, tmp)), flush=True)
        print(json.dumps({"bench": "meta_end", "loadavg_end": os.getloadavg()[0]}), flush=True)


if __name__ == "__main__":
    main()
