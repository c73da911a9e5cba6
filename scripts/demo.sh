#!/usr/bin/env bash
# Kiln's main job on its embedded defaults, end to end: set up the machine,
# build, start the server kilnd on a free loopback port, then, as a client,
# compile an example model on it, run it (random arguments from seed 0),
# print the result and the server's stats, train the Python client's digits
# example for a few steps through it (when .venv has the client), and stop
# the server with SIGTERM
# (it drains and exits 0). Without kilnd (a build with no gRPC core) the
# same module runs in process instead, unless KILN_DEMO_REQUIRE_SERVER=1
# (scripts/test.sh sets it): then a missing kilnd is a failure.
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."
JOBS=${KILN_JOBS:-$(nproc)}
MODULE=${1:-examples/mlp.hlo}

./scripts/setup.sh
# Same build type as scripts/test.sh, so that the two share build/ without
# reconfiguring it.
cmake -S . -B build -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null
targets=(kiln)
# The list of targets is read whole before it is searched: under pipefail,
# `cmake ... | grep -q` fails whenever grep exits at its first match and the
# build tool then dies of SIGPIPE.
build_targets=$(cmake --build build --target help 2>/dev/null || true)
if grep -qw kilnd <<<"$build_targets"; then
  targets+=(kilnd)
fi
cmake --build build -j "$JOBS" --target "${targets[@]}"

if [ ! -x build/kiln ]; then
  echo "demo: build/kiln was not built (clients/cli/ has no sources yet)" >&2
  exit 1
fi
if [ ! -f "$MODULE" ]; then
  echo "demo: $MODULE not found" >&2
  exit 1
fi

show() { # prints a command the way a user would type it, then runs it
  echo
  echo "\$ $*"
  "$@"
}

if [ ! -x build/server/kilnd ]; then
  if [ "${KILN_DEMO_REQUIRE_SERVER:-0}" = 1 ]; then
    echo "demo: kilnd was not built (no gRPC core?), and KILN_DEMO_REQUIRE_SERVER=1" >&2
    exit 1
  fi
  echo "demo: kilnd was not built (no gRPC core); running in process instead"
  show build/kiln run "$MODULE" --random-args 0
  exit 0
fi

log=$(mktemp -d)
build/server/kilnd --listen 127.0.0.1:0 --metrics-listen 127.0.0.1:0 >"$log/out" 2>"$log/err" &
kilnd=$!
stop_kilnd() {
  if kill -0 "$kilnd" 2>/dev/null; then
    kill -TERM "$kilnd"
    wait "$kilnd" || true
  fi
  rm -rf "$log"
}
trap stop_kilnd EXIT

addr=""
for _ in $(seq 600); do
  addr=$(sed -n 's/^kilnd: listening on //p' "$log/out")
  [ -n "$addr" ] && break
  if ! kill -0 "$kilnd" 2>/dev/null; then
    echo "demo: kilnd exited before listening:" >&2
    cat "$log/err" >&2
    exit 1
  fi
  sleep 0.1
done
if [ -z "$addr" ]; then
  echo "demo: kilnd printed no address" >&2
  exit 1
fi
metrics=$(sed -n 's/^kilnd: metrics listening on //p' "$log/out")
echo
echo "kilnd is listening on $addr (Prometheus metrics on http://$metrics/metrics)"

show build/kiln compile "$MODULE" --server "$addr"
show build/kiln run "$MODULE" --random-args 0 --server "$addr"
show build/kiln stats --server "$addr"

# The Python thin client (clients/python, installed into .venv by setup.sh):
# a short digits training run through the same kilnd, when .venv has it.
py=.venv/bin/python
if [ -x "$py" ] && "$py" -c 'import kiln, sklearn' 2>/dev/null; then
  show env KILN_SERVER="$addr" "$py" examples/python/train_digits.py --steps 40 --plot ''
else
  echo
  echo "demo: skipping the Python client example (no .venv with the kiln client and scikit-learn)"
fi

echo
echo "\$ kill -TERM $kilnd    # kilnd drains and exits"
kill -TERM "$kilnd"
status=0
wait "$kilnd" || status=$?
cat "$log/err"
echo "kilnd exited with status $status"
exit "$status"
