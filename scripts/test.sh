#!/usr/bin/env bash
# Runs every test Kiln has, the way CI does:
#   1. scripts/setup.sh (Debian packages, .venv), then scripts/format.sh
#      --check: every tracked C file follows .clang-format
#   2. build/       RelWithDebInfo, -Werror; ctest: every registered test
#                   (unit, golden, corpus conformance, JAX peer)
#   3. build-asan/  ASan+UBSan, -Werror; ctest -L unit -LE slow (the suites
#                   labelled slow compile every case with cc; the main build
#                   runs them)
#   4. build-fuzz/  clang + libFuzzer; each fuzz target for a short smoke run,
#                   seeded with examples/, tests/golden/, the corpus (as text,
#                   or encoded by `kiln print --proto` for fuzz_proto; the
#                   request corpus tests/fuzz/corpus/fuzz_rpc/ for fuzz_rpc)
#                   and the inputs kept in tests/fuzz/regressions/<target>/
#   5. scripts/demo.sh, the README's first command, with
#                   KILN_DEMO_REQUIRE_SERVER=1: it must start kilnd, compile
#                   and run through it, and drain it (exit 0)
# Every step runs even when an earlier one failed (as far as its build
# allows); the exit status is non-zero if any step failed. A summary closes
# the output.
#
# Environment: KILN_CORPUS_DIR (default ../shared/corpus/xla-hlo; tests that
# need it skip when it is absent), KILN_FUZZ_SECONDS (per target, default 20),
# KILN_JOBS (default nproc).
set -uo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."
ROOT=$PWD
JOBS=${KILN_JOBS:-$(nproc)}
FUZZ_SECONDS=${KILN_FUZZ_SECONDS:-20}
START=$(date +%s)

results=()  # "name|PASS/FAIL/SKIP|seconds|note"
failed=0
record() { # name status seconds note
  results+=("$1|$2|$3|$4")
  [ "$2" = FAIL ] && failed=$((failed + 1))
  return 0
}
banner() { printf '\n==== %s ====\n' "$*"; }
ctest_counts() { # extracts "N tests passed/failed" from a ctest log
  sed -n 's/.*tests passed, \([0-9]*\) tests failed out of \([0-9]*\).*/\2 run, \1 failed/p' "$1" |
    tail -1
}

# ---- 1. set-up ---------------------------------------------------------------
banner "setup"
t=$(date +%s)
if ! ./scripts/setup.sh; then
  record setup FAIL $(($(date +%s) - t)) "scripts/setup.sh failed"
  echo "test.sh: cannot continue without the set-up" >&2
  exit 1
fi
record setup PASS $(($(date +%s) - t)) ""

banner "format (.clang-format)"
t=$(date +%s)
if ./scripts/format.sh --check; then
  record format PASS $(($(date +%s) - t)) ""
else
  record format FAIL $(($(date +%s) - t)) "run scripts/format.sh"
fi

export KILN_PYTHON=$ROOT/.venv/bin/python
corpus=${KILN_CORPUS_DIR:-$ROOT/../shared/corpus/xla-hlo}
if [ -d "$corpus" ]; then
  export KILN_CORPUS_DIR
  KILN_CORPUS_DIR=$(cd "$corpus" && pwd)
  echo "corpus: $KILN_CORPUS_DIR"
else
  unset KILN_CORPUS_DIR
  echo "corpus: not found at $corpus; tests that need it skip"
fi

LOGS=$ROOT/build/test-logs
mkdir -p "$LOGS"

# ---- 2. main build and every ctest entry ------------------------------------
banner "build (RelWithDebInfo, -Werror) and ctest"
t=$(date +%s)
if cmake -S . -B build -DCMAKE_BUILD_TYPE=RelWithDebInfo -DKILN_WERROR=ON &&
  cmake --build build -j "$JOBS"; then
  record build PASS $(($(date +%s) - t)) ""
  t=$(date +%s)
  if ctest --test-dir build -j "$JOBS" --output-on-failure 2>&1 | tee "$LOGS/ctest.log"; then
    record ctest PASS $(($(date +%s) - t)) "$(ctest_counts "$LOGS/ctest.log")"
  else
    record ctest FAIL $(($(date +%s) - t)) "$(ctest_counts "$LOGS/ctest.log")"
  fi
else
  record build FAIL $(($(date +%s) - t)) "see the compiler output above"
  record ctest SKIP 0 "build failed"
fi

# ---- 3. sanitizers -------------------------------------------------------------
banner "ASan+UBSan build and unit tests"
t=$(date +%s)
# Check runs each test in a forked child; a leak or a sanitizer report makes
# that child exit non-zero, which Check counts as an error of that test.
export ASAN_OPTIONS=detect_leaks=1:abort_on_error=0:strict_string_checks=1:detect_stack_use_after_return=1
export UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1
if cmake -S . -B build-asan -DCMAKE_BUILD_TYPE=RelWithDebInfo -DKILN_SANITIZE=ON \
  -DKILN_WERROR=ON && cmake --build build-asan -j "$JOBS"; then
  record asan-build PASS $(($(date +%s) - t)) ""
  t=$(date +%s)
  if ctest --test-dir build-asan -L unit -LE slow -j "$JOBS" --output-on-failure 2>&1 |
    tee "$LOGS/ctest-asan.log"; then
    record asan-unit PASS $(($(date +%s) - t)) "$(ctest_counts "$LOGS/ctest-asan.log")"
  else
    record asan-unit FAIL $(($(date +%s) - t)) "$(ctest_counts "$LOGS/ctest-asan.log")"
  fi
else
  record asan-build FAIL $(($(date +%s) - t)) "see the compiler output above"
  record asan-unit SKIP 0 "build failed"
fi
unset ASAN_OPTIONS UBSAN_OPTIONS

# ---- 4. fuzz smoke --------------------------------------------------------------
banner "libFuzzer build and ${FUZZ_SECONDS}s smoke run per target"
t=$(date +%s)
if cmake -S . -B build-fuzz -DCMAKE_C_COMPILER=clang -DCMAKE_BUILD_TYPE=RelWithDebInfo \
  -DKILN_FUZZ=ON -DKILN_WERROR=ON && cmake --build build-fuzz -j "$JOBS" --target fuzz; then
  record fuzz-build PASS $(($(date +%s) - t)) ""
  scratch=$(mktemp -d "${TMPDIR:-/tmp}/kiln-fuzz.XXXXXX")
  trap 'rm -rf "$scratch"' EXIT
  shopt -s nullglob
  for fuzzer in build-fuzz/tests/fuzz/fuzz_*; do
    [ -x "$fuzzer" ] && [ -f "$fuzzer" ] || continue
    name=$(basename "$fuzzer")
    t=$(date +%s)
    # New inputs go to a scratch copy; the committed regressions are read only.
    seeds=$scratch/$name
    arts=$ROOT/build-fuzz/artifacts/$name
    rm -rf "$arts"
    mkdir -p "$seeds" "$arts"
    seed_texts=(examples/*.hlo tests/golden/*.hlo)
    [ -n "${KILN_CORPUS_DIR:-}" ] && seed_texts+=("$KILN_CORPUS_DIR"/*.hlo)
    if [ "$name" = fuzz_rpc ]; then
      # Requests, not modules: the committed corpus (tests/fuzz/make_rpc_seeds.py).
      cp tests/fuzz/corpus/fuzz_rpc/* "$seeds/"
    elif [ "$name" = fuzz_proto ] && [ -x build/kiln ]; then
      # The proto decoder's seeds: the same modules, encoded.
      for f in "${seed_texts[@]}"; do
        base=$(basename "$(dirname "$f")")_$(basename "$f" .hlo)
        build/kiln print --proto -o "$seeds/$base.pb" "$f" 2>/dev/null || true
      done
    else
      for f in "${seed_texts[@]}"; do
        cp "$f" "$seeds/$(basename "$(dirname "$f")")_$(basename "$f")"
      done
    fi
    dirs=("$seeds")
    [ -d "tests/fuzz/regressions/$name" ] && dirs+=("tests/fuzz/regressions/$name")
    dict=()
    [ -f "build-fuzz/tests/fuzz/$name.dict" ] && dict=("-dict=build-fuzz/tests/fuzz/$name.dict")
    echo "$name: ${FUZZ_SECONDS}s, seeds: ${dirs[*]}"
    if "$fuzzer" -max_total_time="$FUZZ_SECONDS" -timeout=10 -rss_limit_mb=2048 \
      -print_final_stats=1 -artifact_prefix="$arts/" "${dict[@]}" "${dirs[@]}" \
      > "$LOGS/$name.log" 2>&1; then
      execs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$LOGS/$name.log")
      cov=$(grep -o 'cov: [0-9]*' "$LOGS/$name.log" | tail -1)
      record "$name" PASS $(($(date +%s) - t)) "${execs:-?} execs, ${cov:-cov: ?}"
    else
      tail -40 "$LOGS/$name.log"
      crash=$(ls -t "$arts" 2>/dev/null | head -1)
      record "$name" FAIL $(($(date +%s) - t)) "artifact: ${crash:+$arts/$crash}"
    fi
  done
  shopt -u nullglob
else
  record fuzz-build FAIL $(($(date +%s) - t)) "see the compiler output above"
fi

# ---- 5. the demo, through kilnd -------------------------------------------------
banner "demo (scripts/demo.sh through kilnd)"
t=$(date +%s)
if KILN_DEMO_REQUIRE_SERVER=1 ./scripts/demo.sh 2>&1 | tee "$LOGS/demo.log" &&
  grep -q '^kilnd is listening on ' "$LOGS/demo.log" &&
  grep -q -- '--server ' "$LOGS/demo.log" &&
  grep -q '^kilnd exited with status 0$' "$LOGS/demo.log"; then
  record demo PASS $(($(date +%s) - t)) "compiled and ran through kilnd, drained"
else
  record demo FAIL $(($(date +%s) - t)) "see $LOGS/demo.log"
fi

# ---- summary ---------------------------------------------------------------------
banner "summary"
passed=0
for r in "${results[@]}"; do
  IFS='|' read -r name status secs note <<< "$r"
  printf '%-14s %-4s %5ss  %s\n' "$name" "$status" "$secs" "$note"
  [ "$status" = PASS ] && passed=$((passed + 1))
done
echo "total time: $(($(date +%s) - START))s on $JOBS cores; logs in build/test-logs/"
echo "steps: $passed passed, $failed failed"
[ "$failed" -eq 0 ]
