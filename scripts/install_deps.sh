#!/usr/bin/env bash
# Installs everything Sluice needs on Debian 12: build tools and libraries from Debian's
# packages, the pinned Python test/benchmark tools into .venv (never on the serving path), and,
# for CUDA builds, a CUDA-aware UCX (below).
#
#   scripts/install_deps.sh --runtime   only the shared libraries a built `sluice` loads (the
#                                       container images' runtime stage, deploy/docker/)
set -euo pipefail

if [ "${1:-}" = "--runtime" ]; then
  RUNTIME_PACKAGES=(libabsl20220623 libgrpc++1.51 libgrpc29 libprotobuf32 libucx0 libpcre2-8-0
                    libxxhash0 libssl3 libnuma1 libc-ares2 libre2-9 libicu72 zlib1g
                    libpng16-16 libjpeg62-turbo libwebp7 ca-certificates)
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
    "${RUNTIME_PACKAGES[@]}"
  rm -rf /var/lib/apt/lists/*
  exit 0
fi
cd "$(dirname "$0")/.."

APT_PACKAGES=(
  build-essential cmake ninja-build ccache pkg-config git patchelf
  libabsl-dev nlohmann-json3-dev libboost-dev libboost-system-dev libpcre2-dev libicu-dev libcli11-dev
  libspdlog-dev libfmt-dev libxxhash-dev libgtest-dev libgmock-dev
  libucx-dev ucx-utils
  libpng-dev libjpeg62-turbo-dev libwebp-dev
  libgrpc++-dev libprotobuf-dev protobuf-compiler protobuf-compiler-grpc libssl-dev openssl
  python3 python3-venv curl
  clang libclang-rt-dev  # libFuzzer targets (scripts/fuzz.sh)
  prometheus  # promtool: tests lint every pod's /metrics
  iproute2  # ip netns / tc: the multi-host tests (tests/integration/test_netns.py)
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
  # requirements-no-deps.txt: packages whose declared dependencies the tests do not need (it
  # says why), installed without them.
  if ! cat tests/requirements.txt tests/requirements-no-deps.txt | cmp -s - .venv/.requirements.installed; then
    .venv/bin/pip install -q --disable-pip-version-check -r tests/requirements.txt
    .venv/bin/pip install -q --disable-pip-version-check --no-deps -r tests/requirements-no-deps.txt
    cat tests/requirements.txt tests/requirements-no-deps.txt > .venv/.requirements.installed
  fi
fi

# CUDA builds (nvcc found, as cmake/cuda.cmake looks for it, and SLUICE_CUDA not OFF) move KV
# out of device memory, which Debian's UCX 1.13 (built without CUDA) cannot see. They use the UCX
# that PyPI's libucx-cu13 ships (headers, libraries, the cuda_copy/cuda_ipc transports and a
# CUDA-aware ucx_perftest), unpacked into .deps/ucx-cu13 (cmake/ucx.cmake finds it there). Only
# the wheel's files are used; nothing of it runs in Python. CPU-only builds keep Debian's UCX.
UCX_CU13_VERSION=1.22.0
find_nvcc() {
  local c
  for c in "${CUDACXX:-}" "${CUDA_HOME:+$CUDA_HOME/bin/nvcc}" "${CUDA_PATH:+$CUDA_PATH/bin/nvcc}" \
           "$(command -v nvcc 2>/dev/null || true)" /usr/local/cuda/bin/nvcc; do
    if [ -n "$c" ] && [ -x "$c" ]; then return 0; fi
  done
  return 1
}
if [ "$(echo "${SLUICE_CUDA:-AUTO}" | tr a-z A-Z)" != "OFF" ] && find_nvcc; then
  UCX_DIR=.deps/ucx-cu13
  if [ "$(cat "$UCX_DIR/.installed" 2>/dev/null)" != "$UCX_CU13_VERSION" ]; then
    echo "[install] libucx-cu13==$UCX_CU13_VERSION into $UCX_DIR"
    PIP=.venv/bin/pip
    if [ ! -x "$PIP" ]; then
      python3 -m venv .deps/venv
      PIP=.deps/venv/bin/pip
    fi
    rm -rf "$UCX_DIR"
    "$PIP" install -q --disable-pip-version-check --no-deps --target "$UCX_DIR" \
      "libucx-cu13==$UCX_CU13_VERSION"
    echo "$UCX_CU13_VERSION" > "$UCX_DIR/.installed"
  fi
fi
