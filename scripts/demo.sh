#!/usr/bin/env bash
# Kiln's main job on its embedded defaults, end to end: set up the machine,
# build, then compile and run an example HLO module in process with the
# `kiln` command (random arguments from seed 0) and print the result.
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."
JOBS=${KILN_JOBS:-$(nproc)}
MODULE=${1:-examples/mlp.hlo}

./scripts/setup.sh
# Same build type as scripts/test.sh, so that the two share build/ without
# reconfiguring it.
cmake -S . -B build -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null
cmake --build build -j "$JOBS" --target kiln

if [ ! -x build/kiln ]; then
  echo "demo: build/kiln was not built (clients/cli/ has no sources yet)" >&2
  exit 1
fi
if [ ! -f "$MODULE" ]; then
  echo "demo: $MODULE not found" >&2
  exit 1
fi
echo
echo "\$ build/kiln run $MODULE --random-args 0"
build/kiln run "$MODULE" --random-args 0
