#!/usr/bin/env bash
# Prepares a Debian 12 machine to build and test Kiln: installs the Debian
# packages the build needs (only those missing), the project's Python
# virtual environment .venv (only when requirements.txt changed since the last
# install) and the Python client clients/python into it (only when its sources,
# proto/ or the environment changed). Idempotent: a second run does nothing and
# says so.
#
# Runs as root, or through sudo when that is available.
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."
ROOT=$PWD

# What the build and the tests use:
#   build-essential cmake pkg-config    the C toolchain and build
#   protobuf-c-compiler libprotobuf-c-dev protobuf-compiler
#                                       proto/ stubs (protoc-c) and their runtime
#   check libsubunit-dev                the unit test framework
#   clang libclang-rt-14-dev            libFuzzer builds (tests/fuzz)
#   clang-format                        the house format (scripts/format.sh)
#   python3 python3-venv                the .venv for the JAX peer tests
#   libopenblas-dev                     dot on the CPU backend (cblas)
#   libdnnl-dev                         convolution on the CPU backend (oneDNN)
#   libfftw3-dev                        fft on the CPU backend (FFTW, opened at run
#                                       time: without it ffts run as a direct DFT)
#   libglpk-dev                         auto-sharding's integer program (GLPK; without
#                                       it --auto-shard says Kiln was built without it)
#   libgrpc-dev libuv1-dev libssl-dev   kilnd: gRPC core, its event loop, SHA-256
#   libhiredis-dev redis-server         the shared cache tier and its tests
#   openssl                             test certificates (tests/integration/test_security.c)
#   systemd                             systemd-analyze verify of deploy/systemd (tests/deploy)
PACKAGES=(
  build-essential cmake pkg-config
  protobuf-c-compiler libprotobuf-c-dev protobuf-compiler
  check libsubunit-dev
  clang libclang-rt-14-dev clang-format
  python3 python3-venv
  libopenblas-dev libdnnl-dev libfftw3-dev libglpk-dev
  libgrpc-dev libuv1-dev libssl-dev
  libhiredis-dev redis-server openssl
  systemd
)

say() { printf 'setup: %s\n' "$*"; }

as_root() {
  if [ "$(id -u)" -eq 0 ]; then
    "$@"
  elif command -v sudo >/dev/null 2>&1; then
    sudo "$@"
  else
    say "need root (or sudo) to run: $*" >&2
    exit 1
  fi
}

# ---- Debian packages -------------------------------------------------------
missing=()
for p in "${PACKAGES[@]}"; do
  status=$(dpkg-query -W -f='${db:Status-Status}' "$p" 2>/dev/null || true)
  [ "$status" = "installed" ] || missing+=("$p")
done
if [ ${#missing[@]} -eq 0 ]; then
  say "Debian packages: all ${#PACKAGES[@]} already installed"
else
  say "Debian packages: installing ${missing[*]}"
  as_root env DEBIAN_FRONTEND=noninteractive \
    apt-get -o DPkg::Lock::Timeout=600 update -q
  as_root env DEBIAN_FRONTEND=noninteractive \
    apt-get -o DPkg::Lock::Timeout=600 install -y -q "${missing[@]}"
  say "Debian packages: installed ${#missing[@]}"
fi

# ---- Python virtual environment --------------------------------------------
# Debian's interpreter, not whatever python3 comes first on PATH: the pins in
# requirements.txt are resolved for it.
PY=/usr/bin/python3
VENV=$ROOT/.venv
STAMP=$VENV/.requirements.sha256
want=$( { sha256sum requirements.txt | cut -d' ' -f1; "$PY" -c 'import sys; print(sys.version)'; } \
        | sha256sum | cut -d' ' -f1)

venv_ok() {
  [ -x "$VENV/bin/python" ] && "$VENV/bin/python" -c 'import sys' 2>/dev/null &&
    grep -qx "home = /usr/bin" "$VENV/pyvenv.cfg" 2>/dev/null
}

if venv_ok && [ "$(cat "$STAMP" 2>/dev/null)" = "$want" ]; then
  say ".venv: up to date with requirements.txt"
else
  if ! venv_ok; then
    say ".venv: creating with $PY ($("$PY" --version 2>&1))"
    rm -rf "$VENV"
    "$PY" -m venv "$VENV"
  fi
  say ".venv: installing requirements.txt"
  rm -f "$STAMP"
  "$VENV/bin/python" -m pip install -q --disable-pip-version-check --no-input \
    -r requirements.txt
  "$VENV/bin/python" -m pip check --disable-pip-version-check >/dev/null
  echo "$want" > "$STAMP"
  say ".venv: installed $(grep -c '==' requirements.txt) pinned packages"
fi

# ---- the Python client (package kiln) --------------------------------------
# Built without isolation from .venv's own pinned setuptools and grpcio-tools
# (the stubs are generated from proto/ at build time) and without touching
# the pinned dependencies. Re-installed when any file it is built from, or the
# environment above, changed.
CLIENT_STAMP=$VENV/.kiln-client.sha256
client_want=$( { echo "$want"; find clients/python proto -type f \
                   ! -path '*/__pycache__/*' ! -path 'clients/python/build/*' \
                   ! -path '*.egg-info/*' ! -path 'clients/python/tests/*' \
                   -print0 | LC_ALL=C sort -z | xargs -0 sha256sum; } | sha256sum | cut -d' ' -f1)
if [ "$(cat "$CLIENT_STAMP" 2>/dev/null)" = "$client_want" ] &&
   "$VENV/bin/python" -c 'import kiln.v1.kiln_pb2' 2>/dev/null; then
  say "kiln client: up to date with clients/python"
else
  say "kiln client: installing clients/python into .venv"
  rm -f "$CLIENT_STAMP"
  "$VENV/bin/python" -m pip install -q --disable-pip-version-check --no-input \
    --no-deps --no-build-isolation --force-reinstall ./clients/python
  rm -rf clients/python/build clients/python/*.egg-info
  echo "$client_want" > "$CLIENT_STAMP"
  say "kiln client: installed"
fi
say "done"
