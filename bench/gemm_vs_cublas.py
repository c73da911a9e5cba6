#!/usr/bin/env python3
"""Kiln's GEMM on the GPU against a direct cuBLAS call of the same shape
(scripts/gpu-check.sh's GEMM stage; issue 13's goal: >= 0.9x cuBLAS).

For each shape MxNxK and precision it writes the HLO of one dot
(f32[M,K] x f32[K,N], row-major), times it with `kiln bench --backend cuda`
(its run_us_median: one cuBLASLt matmul per run plus Kiln's per-run work)
and times cublasGemmEx of the same product on the same GPU through ctypes
(libcuda.so.1 and libcublas.so.13, no JAX), alternating the two over
--rounds rounds and comparing medians:
  f32   pure f32 on both sides (CUBLAS_COMPUTE_32F; Kiln's default),
  tf32  TF32 tensor cores on both (CUBLAS_COMPUTE_32F_FAST_TF32; Kiln with
        KILN_CUDA_TF32=1, what XLA does for a DEFAULT-precision f32 dot).
Prints one line per case with both TFLOP/s and the ratio, then a JSON
object. Not part of the test suite; needs an NVIDIA GPU and its driver.
"""
import argparse
import ctypes
import json
import os
import statistics
import subprocess
import sys
import tempfile

CUDA_R_32F = 0
COMPUTE = {"f32": 68, "tf32": 77}  # CUBLAS_COMPUTE_32F, CUBLAS_COMPUTE_32F_FAST_TF32


class Cublas:
    def __init__(self):
        self.cu = ctypes.CDLL("libcuda.so.1")
        self.bl = ctypes.CDLL("libcublas.so.13")
        self.check(self.cu.cuInit(0), "cuInit")
        dev = ctypes.c_int()
        self.check(self.cu.cuDeviceGet(ctypes.byref(dev), 0), "cuDeviceGet")
        self.ctx = ctypes.c_void_p()
        self.check(self.cu.cuDevicePrimaryCtxRetain(ctypes.byref(self.ctx), dev), "retain")
        self.check(self.cu.cuCtxPushCurrent_v2(self.ctx), "cuCtxPushCurrent")
        self.h = ctypes.c_void_p()
        self.check(self.bl.cublasCreate_v2(ctypes.byref(self.h)), "cublasCreate")

    @staticmethod
    def check(r, what):
        if r != 0:
            raise RuntimeError("%s failed: %d" % (what, r))

    def alloc(self, n):
        p = ctypes.c_uint64()
        self.check(self.cu.cuMemAlloc_v2(ctypes.byref(p), ctypes.c_size_t(n * 4)), "cuMemAlloc")
        # 0.01f everywhere: no denormals, no overflow
        self.check(self.cu.cuMemsetD32_v2(p, ctypes.c_uint(0x3C23D70A), ctypes.c_size_t(n)),
                   "cuMemsetD32")
        return p

    def time_us(self, m, n, k, prec, iters):
        """The mean over iters of C = A B, row-major m x n (as
        column-major C^T = B^T A^T), in microseconds per call."""
        a, b, c = self.alloc(m * k), self.alloc(k * n), self.alloc(m * n)
        alpha, beta = ctypes.c_float(1), ctypes.c_float(0)

        def call():
            self.check(self.bl.cublasGemmEx(
                self.h, 0, 0, n, m, k, ctypes.byref(alpha), b, CUDA_R_32F, n, a, CUDA_R_32F, k,
                ctypes.byref(beta), c, CUDA_R_32F, n, COMPUTE[prec], -1), "cublasGemmEx")

        e0, e1 = ctypes.c_void_p(), ctypes.c_void_p()
        self.check(self.cu.cuEventCreate(ctypes.byref(e0), 0), "cuEventCreate")
        self.check(self.cu.cuEventCreate(ctypes.byref(e1), 0), "cuEventCreate")
        for _ in range(3):
            call()
        self.check(self.cu.cuEventRecord(e0, None), "cuEventRecord")
        for _ in range(iters):
            call()
        self.check(self.cu.cuEventRecord(e1, None), "cuEventRecord")
        self.check(self.cu.cuEventSynchronize(e1), "cuEventSynchronize")
        ms = ctypes.c_float()
        self.check(self.cu.cuEventElapsedTime(ctypes.byref(ms), e0, e1), "cuEventElapsedTime")
        for p in (a, b, c):
            self.cu.cuMemFree_v2(p)
        self.cu.cuEventDestroy_v2(e0)
        self.cu.cuEventDestroy_v2(e1)
        return ms.value * 1000.0 / iters


def hlo(m, n, k):
    return ("HloModule gemm_%dx%dx%d\nENTRY e {\n  a = f32[%d,%d]{1,0} parameter(0)\n"
            "  b = f32[%d,%d]{1,0} parameter(1)\n  ROOT d = f32[%d,%d]{1,0} dot(a, b), "
            "lhs_contracting_dims={1}, rhs_contracting_dims={0}\n}\n" % (m, n, k, m, k, k, n, m, n))


def kiln_us(kiln, path, prec, iters, timeout):
    env = dict(os.environ)
    if prec == "tf32":
        env["KILN_CUDA_TF32"] = "1"
    else:
        env.pop("KILN_CUDA_TF32", None)
    r = subprocess.run([kiln, "bench", path, "--backend", "cuda", "--iters", str(iters)],
                       capture_output=True, text=True, env=env, timeout=timeout)
    if r.returncode != 0:
        raise RuntimeError("kiln bench: " + (r.stderr or r.stdout).strip()[-400:])
    out = r.stdout.strip().splitlines()[-1]
    return json.loads(out)["run_us_median"]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--kiln", default="build-gpu/kiln")
    ap.add_argument("--shapes", default="4096x4096x4096,8192x8192x8192,2048x8192x1024")
    ap.add_argument("--precisions", default="f32,tf32")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--iters", type=int, default=20)
    ap.add_argument("--timeout", type=int, default=60)
    o = ap.parse_args()
    blas = Cublas()
    res = []
    tmp = tempfile.mkdtemp(prefix="kiln-gemm-")
    for shape in o.shapes.split(","):
        m, n, k = (int(x) for x in shape.split("x"))
        path = os.path.join(tmp, "gemm_%s.hlo" % shape)
        with open(path, "w") as f:
            f.write(hlo(m, n, k))
        for prec in o.precisions.split(","):
            ks, cs = [], []
            try:
                for _ in range(o.rounds):  # alternating, medians of the rounds
                    ks.append(kiln_us(o.kiln, path, prec, o.iters, o.timeout))
                    cs.append(blas.time_us(m, n, k, prec, o.iters))
            except Exception as e:  # noqa: BLE001 - reported, the next case runs
                print("gemm %s %s: FAILED: %s" % (shape, prec, e))
                res.append({"shape": shape, "precision": prec, "error": str(e)})
                continue
            kmed, cmed = statistics.median(ks), statistics.median(cs)
            flops = 2.0 * m * n * k
            row = {"shape": shape, "precision": prec, "kiln_us": kmed, "cublas_us": cmed,
                   "kiln_TFLOPs": flops / kmed / 1e6, "cublas_TFLOPs": flops / cmed / 1e6,
                   "ratio": cmed / kmed}
            res.append(row)
            print("gemm %s %s: kiln %.1f TFLOP/s (%.0f us), cuBLAS %.1f TFLOP/s (%.0f us): "
                  "ratio %.3f" % (shape, prec, row["kiln_TFLOPs"], kmed, row["cublas_TFLOPs"],
                                  cmed, row["ratio"]))
            sys.stdout.flush()
    print(json.dumps(res))
    return 1 if any("error" in r for r in res) else 0


if __name__ == "__main__":
    raise SystemExit(main())
