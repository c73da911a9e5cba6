#!/usr/bin/env bash
# The GPU check of issue 13, one prepared script for a machine with an
# NVIDIA GPU (the H200 that is lent at times), under 10 minutes in all:
#
#   1. the GPU: nvidia-smi must list one, else this exits 2 saying so; its
#      compute capability picks the cuda target (KILN_CUDA_TARGET, e.g.
#      cuda-sm_90 on an H100/H200), which the suites below compile for;
#   2. build: a Release tree in build-gpu (16 jobs): kiln and the CUDA
#      suites (test_cuda_pool, test_cuda_backend, test_cuda_codegen,
#      test_cuda_diff); or, where .gpu/kiln-gpu.tar.gz (GPU_CHECK_PREBUILT) is,
#      those programs as scripts/gpu-bundle.sh built them on a Debian
#      machine, for a GPU machine without Kiln's build dependencies (the
#      lent H200: carry .gpu);
#   3. the CUDA suites: the device pool sees the GPU, the backend's pieces
#      and a buffer round trip on the device (test_cuda_backend), the NVRTC
#      corpus compiles for this GPU's sm (test_cuda_codegen), and the CUDA
#      differential suite runs the corpus on the GPU against the
#      interpreter (test_cuda_diff: how many ran, were refused, mismatched);
#   4. benchmarks against JAX on the same GPU (JAX_PLATFORMS=cuda): copy,
#      fused elementwise and GEMMs (bench/gpu_bench.py), the same HLO timed
#      with `kiln bench --backend cuda`; Kiln's GEMM steps (cuBLASLt)
#      against a direct cublasGemmEx of the same shapes, pure f32 and TF32
#      (bench/gemm_vs_cublas.py: the issue's >= 0.9x goal); and the models
#      of bench/bench_models.py with Kiln on --backend cuda.
#
# On the lent H200 (the workplace's device tool), which cannot build Kiln:
# first, here, `scripts/gpu-bundle.sh` (writes .gpu/kiln-gpu.tar.gz), then
# one run carrying .gpu with the command
#   GPU_CHECK_OUT=$OUT/gpu-check.md bash scripts/gpu-check.sh
#
# Every figure, with what failed and why, goes to
# ${GPU_CHECK_OUT:-gpu-check-results.md} for bench/RESULTS.md, and to the
# terminal. The whole script keeps to GPU_CHECK_LIMIT_S (600) seconds:
# each stage runs under the smaller of its own limit and what is left
# (minus a reserve for the summary), and a stage that no longer fits is
# skipped, saying so. Exit status: 0 when every stage ran and passed, 1
# when one failed or was skipped, 2 without a GPU.
#
# Until a GPU ran it, nothing of the cuda backend's execution path has
# run: see docs/architecture.md (CUDA) for what is untested.
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.." || exit 2
out=${GPU_CHECK_OUT:-gpu-check-results.md}
py=${KILN_PYTHON:-python3}
jobs=${GPU_CHECK_JOBS:-16}
limit_total=${GPU_CHECK_LIMIT_S:-600}
reserve=15 # seconds kept for the summary
t_start=$(date +%s)
fail=0

if ! command -v nvidia-smi >/dev/null 2>&1; then
  echo "gpu-check: no GPU here (nvidia-smi is not installed): nothing to check." >&2
  echo "gpu-check: run it on a machine with an NVIDIA GPU and its driver." >&2
  exit 2
fi
if ! gpus=$(timeout 30 nvidia-smi --query-gpu=name,memory.total,driver_version,compute_cap \
  --format=csv,noheader 2>&1) || [ -z "$gpus" ]; then
  echo "gpu-check: no GPU here (nvidia-smi: ${gpus:-lists none}): nothing to check." >&2
  exit 2
fi
cc=$(echo "$gpus" | head -1 | awk -F', ' '{print $4}' | tr -d .)
sm="sm_${cc:-90}"
export KILN_CUDA_TARGET=${KILN_CUDA_TARGET:-cuda-$sm}
export JAX_PLATFORMS=${JAX_PLATFORMS:-cuda}
# JAX would take 75% of the GPU's memory at start, and bench_models runs
# kiln while its JAX process is alive: allocate as needed instead.
export XLA_PYTHON_CLIENT_PREALLOCATE=${XLA_PYTHON_CLIENT_PREALLOCATE:-false}

# The toolkit's libraries that Kiln opens with dlopen, where the loader's
# own path does not have them (a toolkit under /usr/local/cuda*, or the
# nvidia-* wheels of the machine's Python): VAR is set to the first match
# unless already set.
find_lib() { # VAR GLOB
  local var=$1 glob=$2 d f sites
  [ -n "${!var:-}" ] && return 0
  sites=$("$py" -c 'import site; print(" ".join(site.getsitepackages()))' 2>/dev/null || true)
  for d in /usr/local/cuda/lib64 /usr/local/cuda*/lib64 /usr/local/cuda*/targets/x86_64-linux/lib \
    $(for x in $sites; do echo "$x"/nvidia/*/lib; done); do
    for f in "$d"/$glob; do
      [ -f "$f" ] && export "$var=$f" && return 0
    done
  done
  return 0
}
find_lib KILN_NVRTC_LIB 'libnvrtc.so.1[23]'
find_lib KILN_CUBLASLT_LIB 'libcublasLt.so.1[23]'
find_lib KILN_NCCL_LIB 'libnccl.so.2'

{
  echo "# gpu-check $(date -u +%Y-%m-%dT%H:%MZ)"
  echo
  echo "GPUs: $gpus"
  echo "commit: $(git rev-parse --short HEAD 2>/dev/null || echo '?')"
  echo "target: $KILN_CUDA_TARGET; JAX_PLATFORMS=$JAX_PLATFORMS; limit ${limit_total} s"
  echo "libraries: nvrtc ${KILN_NVRTC_LIB:-(loader path)}, cuBLASLt ${KILN_CUBLASLT_LIB:-(loader path)}, NCCL ${KILN_NCCL_LIB:-(loader path)}"
  echo
} >"$out"
cat "$out"
note() { echo "$*" | tee -a "$out"; }
left() { echo $((limit_total - reserve - ($(date +%s) - t_start))); }
# stage NAME LIMIT_S CMD...: runs CMD under min(LIMIT_S, time left), notes
# its outcome and the tail of its output; skipped when under 10 s are left.
stage() {
  local name=$1 limit=$2
  shift 2
  local l
  l=$(left)
  if [ "$l" -lt 10 ]; then
    note "- $name: SKIPPED (${l} s left of the ${limit_total} s)"
    fail=1
    return 124
  fi
  [ "$limit" -gt "$l" ] && limit=$l
  local log t0 rc took
  log=$(mktemp)
  t0=$(date +%s)
  timeout --kill-after=10 "$limit" "$@" >"$log" 2>&1
  rc=$?
  took=$(($(date +%s) - t0))
  if [ $rc -eq 0 ]; then
    note "- $name: ok (${took} s)"
  else
    if [ $rc -eq 124 ]; then
      note "- $name: TIMED OUT after ${limit} s"
    else
      note "- $name: FAILED (exit $rc, ${took} s)"
    fi
    fail=1
  fi
  # What it measured: its own summary lines first, then the tail.
  grep -E "ran on cuda|refused|MISMATCH|compiled for|Checks:|skipped|no GPU|devices|GPU|Geometric|ratio" \
    "$log" | head -n 40 | sed 's/^/    /' | tee -a "$out"
  { echo '```'; tail -n 25 "$log"; echo '```'; } >>"$out"
  rm -f "$log"
  return $rc
}

note "## build"
prebuilt=${GPU_CHECK_PREBUILT:-.gpu}
if [ -f "$prebuilt/kiln-gpu.tar.gz" ]; then
  rm -rf build-gpu-prebuilt && mkdir -p build-gpu-prebuilt &&
    tar -C build-gpu-prebuilt -xzf "$prebuilt/kiln-gpu.tar.gz" ||
    note "- cannot unpack $prebuilt/kiln-gpu.tar.gz"
  prebuilt=build-gpu-prebuilt
fi
if [ -x "$prebuilt/bin/kiln" ]; then
  # Built elsewhere by scripts/gpu-bundle.sh (this machine may lack Kiln's
  # build dependencies): its programs, its libraries first on the path, and
  # the source folder its suites read tests/data from, linked to this one.
  bin=$prebuilt/bin
  src=$(cat "$prebuilt/SOURCE_DIR" 2>/dev/null || true)
  if [ -n "$src" ] && [ ! -e "$src/tests/data/jax" ]; then
    mkdir -p "$(dirname "$src")" && ln -sfn "$PWD" "$src" ||
      note "- cannot link $src to $PWD: the suites will not find tests/data"
  fi
  built=$(cut -c1-12 "$prebuilt/COMMIT" 2>/dev/null || echo '?')
  here=$(git rev-parse --short=12 HEAD 2>/dev/null || echo '?')
  note "- prebuilt: $prebuilt (commit $built; this tree $here), source folder ${src:-?}"
  [ "$built" = "$here" ] || note "- WARNING: the bundle was built from another commit"
  stage "prebuilt programs load" 30 sh -c "for f in $prebuilt/libexec/*; do LD_LIBRARY_PATH=$prebuilt/lib ldd \$f | grep 'not found' && exit 1; done; $bin/kiln help >/dev/null" ||
    {
      note "prebuilt programs cannot load: no further stages"
      exit 1
    }
else
  bin=build-gpu
  # not -Werror: another compiler's new warnings must not cost the GPU run
  stage "configure" 120 cmake -S . -B build-gpu -DCMAKE_BUILD_TYPE=Release -DKILN_WERROR=OFF
  stage "build" 300 cmake --build build-gpu -j "$jobs" --target kiln test_cuda_pool \
    test_cuda_backend test_cuda_codegen test_cuda_diff test_cuda_nccl ||
    {
      note "build failed: no further stages"
      exit 1
    }
  bin_tests=build-gpu/tests
fi
tests=${bin_tests:-$bin}

note "## CUDA suites"
stage "device pool (test_cuda_pool)" 60 "$tests"/test_cuda_pool
stage "backend pieces and a device round trip (test_cuda_backend)" 60 \
  "$tests"/test_cuda_backend
stage "NVRTC corpus for $KILN_CUDA_TARGET (test_cuda_codegen)" 120 \
  env KILN_CORPUS_DIR="${KILN_CORPUS_DIR:-}" "$tests"/test_cuda_codegen
stage "CUDA differential vs the interpreter (test_cuda_diff)" 180 \
  env CK_DEFAULT_TIMEOUT=170 "$tests"/test_cuda_diff
stage "NCCL through the real libnccl (test_cuda_nccl, real mode)" 60 \
  env KILN_TEST_REAL_NCCL=1 "$tests"/test_cuda_nccl

note "## benchmarks against JAX on the same GPU"
exp=$(mktemp -d)
l=$(left)
if [ "$l" -gt 60 ] && timeout $((l < 180 ? l - 20 : 180)) "$py" bench/gpu_bench.py \
  --export-dir "$exp" >"$exp/jax.json" 2>"$exp/jax.err"; then
  note "- JAX ($JAX_PLATFORMS): $(cat "$exp/jax.json")"
  for f in copy elementwise gemm_f32 gemm_bf16; do
    if [ ! -f "$exp/$f.hlo" ]; then
      note "- kiln $f: no $f.hlo exported"
      fail=1
      continue
    fi
    l=$(left)
    if [ "$l" -lt 20 ]; then
      note "- kiln $f: SKIPPED (${l} s left)"
      fail=1
      continue
    fi
    if r=$(timeout $((l < 60 ? l : 60)) "$bin"/kiln bench "$exp/$f.hlo" --backend cuda \
      --iters 20 2>&1); then
      note "- kiln $f on cuda: $(echo "$r" | tail -3 | tr '\n' ' ')"
    else
      note "- kiln $f on cuda: cannot run: $(echo "$r" | head -3 | tr '\n' ' ')"
      fail=1
    fi
  done
else
  note "- JAX peer figures: FAILED or no time (${l} s left): $(tail -3 "$exp/jax.err" 2>/dev/null | tr '\n' ' ')"
  fail=1
fi
stage "GEMM against a direct cuBLAS call (bench/gemm_vs_cublas.py)" 150 \
  "$py" bench/gemm_vs_cublas.py --kiln build-gpu/kiln --rounds 3 --iters 20 \
  --shapes 4096x4096x4096,8192x8192x8192,2048x8192x1024 --precisions f32,tf32
l=$(left)
if [ "$l" -gt 60 ]; then
  stage "models (bench/bench_models.py --backend cuda, JAX on $JAX_PLATFORMS)" $((l - 5)) \
    "$py" bench/bench_models.py --backend cuda --kiln "$bin"/kiln --rounds 2 \
    --only mlp_grad,transformer,transformer_grad --timeout $((l / 4))
else
  note "- models: SKIPPED, ${l} s left of the ${limit_total} s"
  fail=1
fi
rm -rf "$exp"
note ""
note "total $(($(date +%s) - t_start)) s of ${limit_total}; results in $out"
exit $fail
