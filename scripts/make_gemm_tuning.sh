#!/usr/bin/env bash
# Makes or extends this GPU's GEMM tuning table, configs/gemm_tuning/<GPU name>.json
# (kernels/linear/gemm_tuning_table.h): runs cuda_decode_bench once per model config with the
# autotuner's wider search (--gemm-algo-search 3, LinearOptions::algo_search: enumerated
# cuBLASLt configurations and two-part N splits; ~30 s per model at Llama-3-8B shapes) over the
# decode graph buckets
# 1..256, loading the table first so shapes already tuned with that search are kept, and saves
# it. Runners then load it by default (CudaRunnerOptions::gemm_tuning "auto", `sluice serve
# --gemm-tuning`), skipping the timing for every shape it holds.
#
# Usage: scripts/make_gemm_tuning.sh [BENCH] [CONFIG_DIR...]
#   BENCH       cuda_decode_bench binary (default build/bin/cuda_decode_bench)
#   CONFIG_DIR  model config folders (default bench/configs/llama3-8b
#               bench/configs/deepseek-v2-lite); any Hugging Face config.json folder works.
#   SLUICE_GEMM_TUNING_DIR  where the table lives (default configs/gemm_tuning)
set -euo pipefail
cd "$(dirname "$0")/.."
bench="${1:-build/bin/cuda_decode_bench}"
shift || true
configs=("$@")
[ ${#configs[@]} -gt 0 ] || configs=(bench/configs/llama3-8b bench/configs/deepseek-v2-lite)
dir="${SLUICE_GEMM_TUNING_DIR:-configs/gemm_tuning}"
[ -x "$bench" ] || { echo "make_gemm_tuning: no bench binary at $bench" >&2; exit 1; }
mkdir -p "$dir"
for c in "${configs[@]}"; do
  echo "make_gemm_tuning: $c" >&2
  "$bench" --config "$c" --batches 1,256 --prefill "" --breakdown 0 --decode-steps 8 \
    --gemm-algo-search 3 --gemm-tuning "$dir" --gemm-tuning-save "$dir" --out /dev/null >/dev/null
done
ls -l "$dir"
