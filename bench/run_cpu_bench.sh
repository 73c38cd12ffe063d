#!/usr/bin/env bash
# Builds the benchmarks (Release) and runs the CPU engine benchmark and, when present, the
# tokenizer comparison. Results go to bench/results/ (see bench/README.md).
#
#   bench/run_cpu_bench.sh [engine_throughput flags...]
#   BUILD_DIR=... JOBS=... bench/run_cpu_bench.sh --batches 1,8 --decode-tokens 32,32
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
BUILD_DIR="${BUILD_DIR:-$ROOT/build-release}"
JOBS="${JOBS:-2}"
RESULTS="$ROOT/bench/results"
mkdir -p "$RESULTS"

cmake -S "$ROOT" -B "$BUILD_DIR" -G Ninja -DCMAKE_BUILD_TYPE=Release >/dev/null
ninja -C "$BUILD_DIR" -j"$JOBS" engine_throughput

echo "== engine_throughput ==" >&2
"$BUILD_DIR/bin/engine_throughput" --out "$RESULTS/cpu_engine.json" "$@"

if [[ -f "$ROOT/bench/tokenizer_throughput.py" ]]; then
  echo "== tokenizer_throughput ==" >&2
  # The tokenizer comparison may use a C++ helper built from bench/; build it when it exists.
  for src in "$ROOT"/bench/tokenizer*.cc; do
    [[ -f "$src" ]] && ninja -C "$BUILD_DIR" -j"$JOBS" "$(basename "${src%.cc}")"
  done
  BUILD_DIR="$BUILD_DIR" python3 "$ROOT/bench/tokenizer_throughput.py" \
    --build-dir "$BUILD_DIR" --out "$RESULTS/tokenizer.json"
else
  echo "bench/tokenizer_throughput.py not present: tokenizer comparison skipped" >&2
fi
