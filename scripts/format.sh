#!/usr/bin/env bash
# The house format (.clang-format) over every C source and header git
# tracks. `scripts/format.sh` rewrites them in place; `scripts/format.sh
# --check` changes nothing and fails, listing the files, when any differs
# (scripts/test.sh runs the check). clang-format 14 is Debian 12's.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
CLANG_FORMAT=${CLANG_FORMAT:-clang-format}
mapfile -t files < <(git ls-files '*.c' '*.h')
if [ "${1:-}" = "--check" ]; then
  bad=()
  for f in "${files[@]}"; do
    "$CLANG_FORMAT" --dry-run -Werror "$f" >/dev/null 2>&1 || bad+=("$f")
  done
  if [ "${#bad[@]}" -gt 0 ]; then
    printf 'format: %s differs from .clang-format (run scripts/format.sh)\n' "${bad[@]}" >&2
    exit 1
  fi
  echo "format: ${#files[@]} files follow .clang-format"
  exit 0
fi
"$CLANG_FORMAT" -i "${files[@]}"
