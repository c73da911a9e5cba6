#!/usr/bin/env bash
# Builds, on this (Debian) machine, what scripts/gpu-check.sh runs, for a
# GPU machine that cannot build Kiln itself: the lent H200's image has
# CUDA, CMake, Python and JAX but none of the Debian libraries Kiln links
# (gRPC, protobuf-c, OpenBLAS, GLPK, OpenSSL's libcrypto, ...), and nothing
# can be installed there.
#
#   scripts/gpu-bundle.sh [DIR]        (default DIR: .gpu)
#
# writes DIR/kiln-gpu.tar.gz (about 22 MiB: OpenBLAS is most of it) and
# DIR/COMMIT. The archive holds:
#
# bin    kiln and the CUDA suites (test_cuda_pool, test_cuda_backend,
#            test_cuda_codegen, test_cuda_diff): scripts that run the
#            programs of libexec, a Release build of this tree, with
#            lib first on their library path (for them alone: a Python
#            or a compiler they start keeps the machine's own libraries)
# lib        every shared library they load that is not part of the C
#            runtime every Linux has (glibc, libstdc++, libgcc_s) nor of the
#            NVIDIA driver or toolkit (libcuda, libnvrtc, cuBLAS, NCCL: the
#            GPU machine's own, opened with dlopen at first use)
# SOURCE_DIR the source folder the suites were built with (they read
#            tests/data from it): gpu-check.sh links it to the checkout there
# COMMIT     the tree's commit, so a stale bundle is noticed
#
# gpu-check.sh unpacks and uses it when DIR/kiln-gpu.tar.gz exists
# (GPU_CHECK_PREBUILT names another DIR) instead of configuring and
# building. The device tool carries an
# ignored folder named in `carry`: DIR is in .gitignore for that, and the
# bundle must stay under the tool's 64 MiB with the tree (checked below).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
out=${1:-.gpu}
build=${GPU_BUNDLE_BUILD:-build-gpu-bundle}
dir=$build/bundle
jobs=${GPU_BUNDLE_JOBS:-$(nproc)}
targets=(kiln test_cuda_pool test_cuda_backend test_cuda_codegen test_cuda_diff test_cuda_nccl)
limit_mb=48

launcher=()
command -v ccache >/dev/null 2>&1 && launcher=(-DCMAKE_C_COMPILER_LAUNCHER=ccache)
# Warnings are errors in CI's builds; at -O3 GCC finds false positives of
# its own, which must not stop a bundle.
cmake -S . -B "$build" -DCMAKE_BUILD_TYPE=Release -DKILN_WERROR=OFF "${launcher[@]}" >/dev/null
cmake --build "$build" -j "$jobs" --target "${targets[@]}"

rm -rf "$dir"
mkdir -p "$dir/bin" "$dir/libexec" "$dir/lib"
for t in "${targets[@]}"; do
  f=$(find "$build" -name "$t" -type f -perm -u+x | head -1)
  [ -n "$f" ] || {
    echo "gpu-bundle: $t was not built" >&2
    exit 1
  }
  cp "$f" "$dir/libexec/"
  cat >"$dir/bin/$t" <<EOS
#!/bin/sh
d=\$(cd "\$(dirname "\$0")/.." && pwd)
LD_LIBRARY_PATH="\$d/lib\${LD_LIBRARY_PATH:+:\$LD_LIBRARY_PATH}" exec "\$d/libexec/$t" "\$@"
EOS
  chmod +x "$dir/bin/$t"
done

# The libraries every target loads, found by the dynamic loader here.
# Skipped: the C runtime (present on any Linux, and newer there: an older
# copy first on the path would break the machine's own libraries) and the
# NVIDIA driver and toolkit (the GPU machine's own must be used).
skip='^(linux-vdso|ld-linux|libc|libm|libmvec|libpthread|libdl|librt|libresolv|libutil|libstdc\+\+|libgcc_s|libcuda|libnvrtc|libnvJitLink|libcublas|libcublasLt|libcudnn|libnccl|libcudart)\.so'
for f in "$dir"/libexec/*; do
  ldd "$f" | awk '$2 == "=>" && $3 ~ /^\// {print $1, $3}'
done | sort -u | while read -r soname path; do
  if [[ $soname =~ $skip ]]; then continue; fi
  cp -L "$path" "$dir/lib/$soname"
done
missing=$(for f in "$dir"/libexec/*; do ldd "$f"; done | grep 'not found' | sort -u || true)
if [ -n "$missing" ]; then
  echo "gpu-bundle: unresolved here: $missing" >&2
  exit 1
fi

# The bundle alone must resolve: with only DIR/lib and the skipped runtime.
for f in "$dir"/libexec/*; do
  LD_LIBRARY_PATH="$PWD/$dir/lib" ldd "$f" | awk -v d="$PWD/$dir/lib/" '
    $2 == "=>" && $3 ~ /^\// && index($3, d) != 1 { print $1 }' |
    grep -Ev "$skip" && {
    echo "gpu-bundle: $f loads a library from outside the bundle (above)" >&2
    exit 1
  }
done

(cd "$build" && sed -n 's/^CMAKE_HOME_DIRECTORY:INTERNAL=//p' CMakeCache.txt) >"$dir/SOURCE_DIR"
git rev-parse HEAD >"$dir/COMMIT" 2>/dev/null || echo unknown >"$dir/COMMIT"
mkdir -p "$out"
rm -f "$out/kiln-gpu.tar.gz"
tar -C "$dir" -czf "$out/kiln-gpu.tar.gz" .
cp "$dir/COMMIT" "$out/COMMIT"
mb=$(du -sm "$out" | cut -f1)
echo "gpu-bundle: $out/kiln-gpu.tar.gz: $(ls "$dir/libexec" | wc -l) programs, $(ls "$dir/lib" | wc -l) libraries, ${mb} MiB"
echo "gpu-bundle: built from $(cat "$dir/SOURCE_DIR") at $(cut -c1-12 "$dir/COMMIT")"
if [ "$mb" -gt "$limit_mb" ]; then
  echo "gpu-bundle: ${mb} MiB is over the ${limit_mb} MiB a device run can carry with the tree" >&2
  exit 1
fi
