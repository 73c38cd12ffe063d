#!/usr/bin/env bash
# Builds the benchmarks (Release) and runs the CPU engine benchmark and, when present, the
# tokenizer comparison. Results go to bench/results/ (see bench/README.md).
#
#   bench/run_cpu_bench.sh [engine_throughput flags...]
#   BUILD_DIR=... JOBS=... bench/run_cpu_bench.sh --batches 1,8 --decode-tokens 32,32
#   SKIP_TOKENIZER=1 bench/run_cpu_bench.sh     # engine figures only
#
# engine_throughput runs twice: with the default kernel thread pool (cpu_engine.json) and with
# SLUICE_CPU_THREADS=1 (cpu_engine_1thread.json: per-core figures, unaffected by other load
# competing with the pool's threads).
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
echo "== engine_throughput, SLUICE_CPU_THREADS=1 ==" >&2
SLUICE_CPU_THREADS=1 "$BUILD_DIR/bin/engine_throughput" --out "$RESULTS/cpu_engine_1thread.json" "$@"

if [[ "${SKIP_TOKENIZER:-0}" == 1 ]]; then
  echo "SKIP_TOKENIZER=1: tokenizer comparison skipped" >&2
elif [[ -f "$ROOT/bench/tokenizer_throughput.py" && -f "$ROOT/bench/tokenizer_bench.cc" ]]; then
  echo "== tokenizer_throughput (sluice vs HF tokenizers) ==" >&2
  ninja -C "$BUILD_DIR" -j"$JOBS" tokenizer_bench
  PYTHON="$ROOT/.venv/bin/python"  # has HF `tokenizers` (scripts/install_deps.sh)
  [[ -x "$PYTHON" ]] || PYTHON=python3
  "$PYTHON" "$ROOT/bench/tokenizer_throughput.py" --bin "$BUILD_DIR/bin/tokenizer_bench" \
    --out "$RESULTS/tokenizer_throughput.json"
else
  echo "bench/tokenizer_throughput.py or tokenizer_bench.cc missing: tokenizer comparison skipped" >&2
fi
