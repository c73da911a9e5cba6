#!/usr/bin/env python3
"""numpy.fft as a second baseline for bench_models.py's fft workloads.

Times the same functions as the fft_filter and fft2 workloads of
bench_models.py (same shapes, same [-1, 1) uniform arguments) with numpy.fft
(pocketfft in C, one thread), in float32 where numpy keeps it (numpy >= 2
computes float32 input in complex64; older numpy in complex128). Prints the
median milliseconds of --rounds rounds of --iters calls each. Not part of
the test suite.

    .venv/bin/python bench/bench_fft_numpy.py [--rounds 5] [--iters 20]
"""

import argparse
import time

import numpy as np


def fft_filter(x, gain):
    return np.fft.irfft(np.fft.rfft(x, axis=-1) * gain, n=x.shape[-1], axis=-1)


def fft2_mag(x):
    return np.abs(np.fft.fft2(x))


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--iters", type=int, default=20)
    a = ap.parse_args()
    rng = np.random.default_rng(0)
    uni = lambda *s: rng.uniform(-1, 1, s).astype(np.float32)
    work = {
        "fft_filter": (fft_filter, [uni(64, 8192), uni(64, 4097)]),
        "fft2": (fft2_mag, [uni(16, 256, 256)]),
    }
    print(f"numpy {np.__version__}")
    for name, (fn, args) in work.items():
        out = fn(*args)
        times = []
        for _ in range(a.rounds):
            t0 = time.perf_counter()
            for _ in range(a.iters):
                fn(*args)
            times.append((time.perf_counter() - t0) / a.iters * 1e3)
        times.sort()
        print(f"{name}: {times[len(times) // 2]:.3f} ms (result {out.dtype})")


if __name__ == "__main__":
    main()
