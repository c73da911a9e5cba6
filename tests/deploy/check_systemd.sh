#!/bin/sh
# `systemd-analyze verify` of deploy/systemd/kilnd.service: the unit with
# ExecStart pointed at the built kilnd (verify checks that the binary
# exists), and any word systemd-analyze says (unknown keys, bad values are
# only warnings to it) is a failure. Skipped (77) without systemd-analyze:
# Debian's package systemd has it (scripts/setup.sh installs it).
# Usage: check_systemd.sh UNIT KILND
set -eu
unit=$1
kilnd=$(realpath "$2")
if ! command -v systemd-analyze >/dev/null 2>&1; then
  echo "deploy_systemd: skipped: no systemd-analyze (install the systemd package)"
  exit 77
fi
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
grep -q '^ExecStart=/usr/local/bin/kilnd ' "$unit" || {
  echo "deploy_systemd: $unit: ExecStart does not run /usr/local/bin/kilnd"
  exit 1
}
sed "s|/usr/local/bin/kilnd|$kilnd|" "$unit" > "$dir/kilnd.service"
out=$(SYSTEMD_LOG_LEVEL=notice systemd-analyze verify "$dir/kilnd.service" 2>&1) || {
  printf 'deploy_systemd: systemd-analyze verify failed:\n%s\n' "$out"
  exit 1
}
if [ -n "$out" ]; then
  printf 'deploy_systemd: systemd-analyze verify warned:\n%s\n' "$out"
  exit 1
fi
# The hardening the unit promises (deploy/README.md).
for key in NoNewPrivileges=yes ProtectSystem=strict PrivateTmp=yes DynamicUser=yes \
    CapabilityBoundingSet= RestrictAddressFamilies= SystemCallFilter=@system-service; do
  grep -q "^$key" "$unit" || { echo "deploy_systemd: $unit lacks $key"; exit 1; }
done
echo "deploy_systemd: $unit verifies"
