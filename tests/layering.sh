#!/usr/bin/env bash
# The layers of docs/architecture.md, checked on the include lines: a
# library includes headers only from the libraries below it. Prints every
# include that breaks a rule (FILE:LINE: the line) and exits 1 if any does.
#
#   common/          only common/
#   compiler/ir/     common/, compiler/ir/, generated kiln/v1 stubs
#   compiler/eval/   common/, compiler/ir/, compiler/eval/
#   compiler/        nothing from executor/, cache/, server/, clients/
#   cache/           nothing from executor/, server/, clients/; from compiler/
#                    only compiler/ir/ (and codegen/executable.h, for the
#                    version macros that enter the key)
#   executor/        nothing from cache/, server/, clients/
set -uo pipefail
cd "${1:-$(dirname "${BASH_SOURCE[0]}")/..}" || exit 2

bad=0
# check DIR ALLOWED_REGEX: every quoted include in DIR must match the regex.
check() {
  local dir=$1 allowed=$2 hits
  hits=$(grep -rnE '^[[:space:]]*#[[:space:]]*include[[:space:]]+"' --include='*.c' --include='*.h' \
    "$dir" | grep -vE "#[[:space:]]*include[[:space:]]+\"($allowed)" || true)
  if [ -n "$hits" ]; then
    echo "$hits" | sed "s|^|layering: $dir may not include: |"
    bad=1
  fi
}
# forbid DIR FORBIDDEN_REGEX: no quoted include in DIR may match the regex.
forbid() {
  local dir=$1 forbidden=$2 hits
  hits=$(grep -rnE "^[[:space:]]*#[[:space:]]*include[[:space:]]+\"($forbidden)" \
    --include='*.c' --include='*.h' "$dir" || true)
  if [ -n "$hits" ]; then
    echo "$hits" | sed "s|^|layering: $dir may not include: |"
    bad=1
  fi
}

check common 'common/'
check compiler/ir 'common/|compiler/ir/|kiln/v1/'
check compiler/eval 'common/|compiler/ir/|compiler/eval/'
forbid compiler 'executor/|cache/|server/|clients/'
forbid cache 'executor/|server/|clients/'
check cache 'common/|cache/|compiler/ir/|compiler/codegen/executable\.h|kiln/v1/'
forbid executor 'cache/|server/|clients/'

if [ "$bad" -eq 0 ]; then
  echo "layering: every include follows the layers"
fi
exit "$bad"
