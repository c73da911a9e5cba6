#!/usr/bin/env bash
# Every benchmark of bench/ on two builds of Kiln, in alternating order, so
# that both sides see the same machine load: for a change that must keep
# speed (bench/RESULTS.md records the figures).
#
#   bench/compare_trees.sh BEFORE_DIR AFTER_DIR > out.txt
#
# Each DIR holds kiln, kilnd, bench_parse, rpc_bench and rpc_echo_server
# copied from a build (build/kiln, build/server/kilnd, build/bench/*). Every
# benchmark prints its JSON lines after a "### [round N] SIDE KIND" header.
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
before=${1:?before dir}
after=${2:?after dir}
PY=${KILN_PYTHON:-.venv/bin/python}
for r in 1 2 3; do
  for side in "$before" "$after"; do
    echo "### round $r $side parse $(uptime)"
    "$side"/bench_parse 10 3 2>/dev/null
  done
done
for r in 1 2; do
  for side in "$before" "$after"; do
    echo "### round $r $side cpu $(uptime)"
    $PY bench/bench_cpu.py --kiln "$side"/kiln --rounds 3 --only chain,dot,mlp,compile 2>/dev/null
  done
done
for r in 1 2; do
  for side in "$before" "$after"; do
    echo "### round $r $side rpc $(uptime)"
    "$side"/rpc_bench --kilnd "$side"/kilnd --echo "$before"/rpc_echo_server --seconds 3 \
      --rounds 3 --mib 64 --rss-executes 20000 2>/dev/null
  done
done
for side in "$before" "$after"; do
  echo "### $side train $(uptime)"
  $PY bench/bench_train.py --kiln "$side"/kiln --rounds 3 2>/dev/null
  echo "### $side cache $(uptime)"
  $PY bench/bench_cache.py --kilnd "$side"/kilnd --rounds 2 2>/dev/null
done
