#!/usr/bin/env bash
# The GPU check of issue 13, one prepared script for a machine with an
# NVIDIA GPU (the H200 that is lent at times), under 10 minutes:
#
#   1. the GPU: nvidia-smi must list one, else this exits 2 saying so;
#   2. build: a Release tree in build-gpu (16 jobs), kiln, kilnd and the
#      CUDA suites;
#   3. the CUDA suites: the device pool sees the GPUs (test_cuda_pool), the
#      NVRTC corpus compiles for this GPU's sm (test_cuda_codegen), and the
#      CUDA differential suite against the interpreter (test_cuda_diff) when
#      this tree has one;
#   4. benchmarks against JAX on the same GPU: copy and fused elementwise
#      bandwidth and GEMMs (bench/gpu_bench.py), and the models of
#      bench/bench_models.py with Kiln on --backend cuda;
#
# and writes every figure, with what failed and why, to
# ${GPU_CHECK_OUT:-gpu-check-results.md} for bench/RESULTS.md. Each stage
# has its own time limit, so one that hangs cannot eat the others' time.
# Exit status: 0 when every stage ran, 1 when one failed, 2 without a GPU.
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
out=${GPU_CHECK_OUT:-gpu-check-results.md}
py=${KILN_PYTHON:-python3}
jobs=${GPU_CHECK_JOBS:-16}
t_start=$(date +%s)
fail=0

if ! command -v nvidia-smi >/dev/null 2>&1; then
  echo "gpu-check: no GPU here (nvidia-smi is not installed): nothing to check." >&2
  echo "gpu-check: run it on a machine with an NVIDIA GPU and its driver." >&2
  exit 2
fi
if ! gpus=$(nvidia-smi --query-gpu=name,memory.total,driver_version,compute_cap \
  --format=csv,noheader 2>&1) || [ -z "$gpus" ]; then
  echo "gpu-check: no GPU here (nvidia-smi: ${gpus:-lists none}): nothing to check." >&2
  exit 2
fi
cc=$(echo "$gpus" | head -1 | awk -F', ' '{print $4}' | tr -d .)
sm="sm_${cc:-90}"

{
  echo "# gpu-check $(date -u +%Y-%m-%dT%H:%MZ)"
  echo
  echo "GPUs: $gpus"
  echo "commit: $(git rev-parse --short HEAD 2>/dev/null || echo '?')"
  echo
} >"$out"
note() { echo "$*" | tee -a "$out"; }
stage() { # stage NAME LIMIT_S CMD...: runs CMD, appends its tail to the results
  local name=$1 limit=$2
  shift 2
  local log
  log=$(mktemp)
  local t0=$(date +%s)
  timeout --kill-after=10 "$limit" "$@" >"$log" 2>&1
  local rc=$?
  local took=$(($(date +%s) - t0))
  if [ $rc -eq 0 ]; then
    note "- $name: ok (${took} s)"
  else
    [ $rc -eq 124 ] && note "- $name: TIMED OUT after ${limit} s" || note "- $name: FAILED (exit $rc, ${took} s)"
    fail=1
  fi
  { echo '```'; tail -n 25 "$log"; echo '```'; } >>"$out"
  rm -f "$log"
  return $rc
}

note "## build"
stage "configure" 120 cmake -S . -B build-gpu -DCMAKE_BUILD_TYPE=Release -DKILN_WERROR=ON
stage "build" 300 cmake --build build-gpu -j "$jobs" --target kiln kilnd test_cuda_pool \
  test_cuda_codegen || { note "build failed: no further stages"; exit 1; }

note "## CUDA suites"
stage "device pool (test_cuda_pool)" 60 build-gpu/tests/test_cuda_pool
stage "NVRTC corpus for $sm (test_cuda_codegen)" 120 build-gpu/tests/test_cuda_codegen
if cmake --build build-gpu -j "$jobs" --target test_cuda_diff >/dev/null 2>&1; then
  stage "CUDA differential vs the interpreter (test_cuda_diff)" 180 build-gpu/tests/test_cuda_diff
else
  note "- CUDA differential: no test_cuda_diff in this tree (the cuda backend does not run executables yet)"
  fail=1
fi

note "## benchmarks against JAX on the same GPU"
exp=$(mktemp -d)
if timeout 180 "$py" bench/gpu_bench.py --export-dir "$exp" >"$exp/jax.json" 2>"$exp/jax.err"; then
  note "- JAX: $(cat "$exp/jax.json")"
  for f in copy elementwise gemm_f32 gemm_bf16; do
    if r=$(timeout 60 build-gpu/kiln bench "$exp/$f.hlo" --backend cuda --iters 20 2>&1); then
      note "- kiln $f: $(echo "$r" | tail -3 | tr '\n' ' ')"
    else
      note "- kiln $f: cannot run: $(echo "$r" | head -2 | tr '\n' ' ')"
      fail=1
    fi
  done
else
  note "- JAX peer figures: FAILED: $(tail -3 "$exp/jax.err" | tr '\n' ' ')"
  fail=1
fi
left=$((540 - ($(date +%s) - t_start)))
if [ $left -gt 60 ]; then
  stage "models (bench/bench_models.py --backend cuda)" $((left - 20)) "$py" bench/bench_models.py \
    --backend cuda --kiln build-gpu/kiln --rounds 2 --only mlp_grad,transformer,transformer_grad
else
  note "- models: skipped, ${left} s left of the 10 minutes"
  fail=1
fi
rm -rf "$exp"
note ""
note "total $(($(date +%s) - t_start)) s; results in $out"
exit $fail
