#!/usr/bin/env bash
# Installs everything Sluice needs on Debian 12: build tools and libraries from Debian's
# packages, and the pinned Python test/benchmark tools into .venv (never on the serving path).
set -euo pipefail
cd "$(dirname "$0")/.."

APT_PACKAGES=(
  build-essential cmake ninja-build ccache pkg-config git patchelf
  libabsl-dev nlohmann-json3-dev libboost-dev libboost-system-dev libpcre2-dev libcli11-dev
  libspdlog-dev libfmt-dev libxxhash-dev libgtest-dev libgmock-dev
  libucx-dev ucx-utils
  libgrpc++-dev libprotobuf-dev protobuf-compiler protobuf-compiler-grpc libssl-dev openssl
  python3 python3-venv curl
)

SUDO=""
if [ "$(id -u)" -ne 0 ]; then SUDO="sudo"; fi

missing=()
for p in "${APT_PACKAGES[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  echo "[install] apt packages: ${missing[*]}"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi

if [ "${SLUICE_SKIP_PYTHON:-0}" != "1" ]; then
  if [ ! -x .venv/bin/python ]; then
    echo "[install] python venv in .venv"
    python3 -m venv .venv
  fi
  if ! cmp -s tests/requirements.txt .venv/.requirements.installed 2>/dev/null; then
    .venv/bin/pip install -q --disable-pip-version-check -r tests/requirements.txt
    cp tests/requirements.txt .venv/.requirements.installed
  fi
fi
