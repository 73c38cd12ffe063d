#!/usr/bin/env bash
# The GPU runs of issue 21 that a machine without a GPU cannot do, in one go (H200; a second GPU
# is used when visible). Writes bench/results/*_h200.json (+ .png) and prints a summary; exit 1 if
# any equality check fails.
#
#   scripts/gpu_disagg_runs.sh [--skip-build] [--requests 200]
#
# 1. Equality: router + 1 prefill + 1 decode (--device cuda, KV GPU to GPU over UCX cuda_ipc)
#    against `sluice serve --device cuda`, greedy tokens of every request, free KV blocks back to
#    baseline (bench/gpu_disagg_equality.py), per model, pull and push; one GPU per worker when
#    two are visible.
# 2. Transfer bandwidth beside ucx_perftest (the libucx-cu13 one, same transport, same call):
#    device memory over cuda_ipc, device memory over tcp (UCX's cuda_copy staging), host memory
#    over sm (bench/kv_transfer_bench.py); Sluice's staged path (device KV through pinned host
#    slots, StagedKvTransfer) over tcp.
# 3. Handover vs transfer p50/p99 with CUDA workers.
set -euo pipefail
cd "$(dirname "$0")/.."
SKIP_BUILD=0
REQUESTS=200
while [ $# -gt 0 ]; do
  case "$1" in
    --skip-build) SKIP_BUILD=1; shift ;;
    --requests) REQUESTS="$2"; shift 2 ;;
    *) echo "gpu_disagg_runs.sh: unknown flag $1" >&2; exit 2 ;;
  esac
done
if [ "$SKIP_BUILD" = 0 ]; then
  scripts/install_deps.sh
  SLUICE_CUDA=ON scripts/build.sh
fi
export SLUICE_BIN="$PWD/build/bin/sluice"
ldd "$SLUICE_BIN" | grep -q ucx-cu13 || {
  echo "gpu_disagg_runs.sh: $SLUICE_BIN does not link the CUDA-aware UCX (.deps/ucx-cu13)" >&2
  exit 1
}
UCX_LIB="$PWD/.deps/ucx-cu13/libucx/lib"
PERFTEST="$PWD/.deps/ucx-cu13/libucx/bin/ucx_perftest"
NGPU=$(nvidia-smi -L | wc -l)
SHARED="${SLUICE_SHARED_DIR:-$PWD/../shared}"
MODELS=(models/sluice-mini-moe "$SHARED/fixtures/llama-tiny" "$SHARED/fixtures/deepseek-v3-tiny"
        "$SHARED/fixtures/qwen3-hybrid-tiny" "$SHARED/models/sluice-mini-swa")
FAILED=0
mkdir -p bench/results
for model in "${MODELS[@]}"; do
  name=$(basename "$model")
  for mode in pull push; do
    GPU_SETS=("")
    [ "$NGPU" -ge 2 ] && GPU_SETS+=("0,1")
    for gpus in "${GPU_SETS[@]}"; do
      tag="${name}_${mode}${gpus:+_2gpu}"
      echo "== equality $tag"
      if ! .venv/bin/python bench/gpu_disagg_equality.py --model "$model" --mode "$mode" \
          --requests "$REQUESTS" ${gpus:+--gpus "$gpus"} \
          --out "bench/results/gpu_disagg_equality_${tag}_h200.json"; then
        FAILED=1
      fi
    done
  done
done
for run in "cuda sm,cuda_ipc,cuda_copy cuda_ipc" "cuda tcp,cuda_copy tcp_staged" "host sm host_sm"; do
  read -r memory tls tag <<< "$run"
  echo "== transfer $tag ($memory memory, UCX_TLS=$tls)"
  LD_LIBRARY_PATH="$UCX_LIB" .venv/bin/python bench/kv_transfer_bench.py --memory "$memory" \
    --tls "$tls" --perftest "$PERFTEST" --repeats 3 --parts transfer \
    --out "bench/results/kv_transfer_${tag}_h200.json" \
    --plot "bench/results/kv_transfer_${tag}_h200.png" || FAILED=1
done
echo "== Sluice's own staging (device KV through pinned host slots, copies overlapping tcp)"
for op in pull push; do
  UCX_LOG_LEVEL=error build/bin/kv_transfer_bench --op=$op --memory=cuda --staged_slots=2 \
    --transports=tcp || FAILED=1
done | tee bench/results/kv_transfer_staged_tcp_h200.jsonl
echo "== handover (router + prefill + decode on the GPU, pull and push)"
.venv/bin/python bench/kv_transfer_bench.py --parts handover --tls sm,cuda_ipc,cuda_copy \
  --handover-worker-args "--device cuda --gpu-memory-utilization 0.4" \
  --out bench/results/kv_handover_h200.json || FAILED=1
exit "$FAILED"
