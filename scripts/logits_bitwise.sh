#!/usr/bin/env bash
# Checks that two builds give bit-identical logits on the served CUDA configurations: runs
# cuda_logits_dump (bench/cuda_logits_dump.cc) from each over the test fixtures and the
# Llama-3-8B / DeepSeek-V2-Lite dummy shapes at batch 1, 64 and 256, and compares the logits'
# fingerprints. Exit code 1 on any difference (the differing lines are printed).
#
# Usage: scripts/logits_bitwise.sh OLD_DUMP NEW_DUMP
#   OLD_DUMP, NEW_DUMP  cuda_logits_dump binaries (e.g. built at the base commit and at the
#                       change; the tool uses only the CudaRunner API, so it builds on both)
#   SLUICE_SHARED_DIR   where fixtures/ lives (default ../shared)
#   LOGITS_BATCHES      default 1,64,256
set -euo pipefail
cd "$(dirname "$0")/.."
old="${1:?usage: scripts/logits_bitwise.sh OLD_DUMP NEW_DUMP}"
new="${2:?usage: scripts/logits_bitwise.sh OLD_DUMP NEW_DUMP}"
shared="${SLUICE_SHARED_DIR:-../shared}"
batches="${LOGITS_BATCHES:-1,64,256}"
cases=(
  "--model $shared/fixtures/llama-tiny"
  "--model $shared/fixtures/qwen3-hybrid-tiny"
  "--model $shared/fixtures/deepseek-v3-tiny"
  "--model tests/fixtures/deepseek-v2-tiny"
  "--config bench/configs/llama3-8b"
  "--config bench/configs/deepseek-v2-lite"
)
rc=0
for c in "${cases[@]}"; do
  # shellcheck disable=SC2086  # $c is "--flag path"
  a="$("$old" $c --batches "$batches")" || { echo "FAIL (old binary) $c" >&2; rc=1; continue; }
  # shellcheck disable=SC2086
  b="$("$new" $c --batches "$batches")" || { echo "FAIL (new binary) $c" >&2; rc=1; continue; }
  if [ "$a" == "$b" ]; then
    echo "same  $c: $(echo "$b" | tr '\n' ' ')"
  else
    echo "DIFF  $c"
    diff <(echo "$a") <(echo "$b") || true
    rc=1
  fi
done
exit $rc
