#!/usr/bin/env bash
# Installs dependencies, builds, and runs every test: C++ unit + golden tests (ctest), then the
# end-to-end tests that drive `sluice serve` with the official OpenAI Python SDK (pytest).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install_deps.sh
scripts/build.sh
BUILD_DIR="${SLUICE_BUILD_DIR:-build}"
echo "[test] ctest"
(cd "$BUILD_DIR" && ctest --output-on-failure -j "${SLUICE_JOBS:-$(nproc)}")
echo "[test] end-to-end (pytest)"
SLUICE_BIN="$PWD/$BUILD_DIR/bin/sluice" .venv/bin/python -m pytest -q tests/e2e
echo "[test] integration (multi-process: router + prefill/decode workers, k8s manifests)"
SLUICE_BIN="$PWD/$BUILD_DIR/bin/sluice" .venv/bin/python -m pytest -q tests/integration
