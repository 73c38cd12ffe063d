#!/usr/bin/env bash
# The GPU runs of issue 21 that a machine without a GPU cannot do, in one go (H200; a second GPU
# is used when visible). Writes OUT/*_h200.json (+ .png) and prints a summary; exit 1 if any
# equality check fails.
#
#   scripts/gpu_disagg_runs.sh [--skip-build] [--requests 200] [--repeats 3] [--models "DIR..."]
#                              [--parts equality,transfer,staged,handover,faults]
#                              [--out bench/results]
#                              [--bundle DIR]
#
# --bundle DIR runs the binaries of scripts/device_bundle.sh (sluice kv_transfer_bench; the
# bundle carries the CUDA-aware UCX's libraries, transport modules, ucx_perftest and ucx_info) with
# the machine's own python3, for GPU machines that have CUDA but none of our Debian packages.
#
# 1. Equality: router + 1 prefill + 1 decode (--device cuda, KV GPU to GPU over UCX cuda_ipc)
#    against `sluice serve --device cuda`, greedy tokens of every request, free KV blocks back to
#    baseline (bench/gpu_disagg_equality.py), per model, pull, push and layerwise; again with
#    --batch-invariant (the concurrent pass exact too); one GPU per worker when two are visible; push again with transfers started late, decoding started late (race
#    checks) and UCX_PROTO_INFO logs; push and layerwise with the prefill worker's KV through
#    its own pinned host staging (--kv-staging on), and pull with the decode worker's KV
#    pulled through its own staging (--kv-staging on there). Each run's sequential pass runs twice and
#    records where each differing request diverges. These runs move every layer's KV
#    (--swa-replay-tokens 0). Models with sliding-window layers (qwen3-hybrid-tiny,
#    sluice-mini-swa) also run pull, push and layerwise with SWA bounded replay on, R at the
#    model's exactness bound (31, 379): only the full-attention layers' KV moves, decode replays
#    the last R prompt tokens; tokens against `sluice serve --device cuda` up to near-tie flips,
#    replayed tokens and moved bytes checked (bench/gpu_disagg_equality.py --swa-replay-tokens).
# 2. Transfer bandwidth beside ucx_perftest (the libucx-cu13 one, same transport, same call):
#    device memory over cuda_ipc, device memory over tcp (UCX's cuda_copy staging), host memory
#    over sm (bench/kv_transfer_bench.py).
# 3. Staged: Sluice's own staging (device KV through pinned host slots, StagedKvTransfer) over tcp.
# 4. Handover vs transfer p50/p99 with CUDA workers.
# 5. Faults: kill -9 of a CUDA decode worker mid-stream and of a prefill worker mid-transfer
#    (bench/gpu_disagg_faults.py, the first model).
# With equality, per model also a pull run with a kvstore behind the prefill worker
# (--kvstore): a fresh prefill worker's pass over the same prompts loads them from the store.
set -euo pipefail
cd "$(dirname "$0")/.."
SKIP_BUILD=0
REQUESTS=200
REPEATS=3
MODEL_LIST=""
PARTS="equality,transfer,staged,handover,faults"
RESULTS=bench/results
BUNDLE=""
while [ $# -gt 0 ]; do
  case "$1" in
    --skip-build) SKIP_BUILD=1; shift ;;
    --requests) REQUESTS="$2"; shift 2 ;;
    --repeats) REPEATS="$2"; shift 2 ;;
    --models) MODEL_LIST="$2"; shift 2 ;;
    --parts) PARTS="$2"; shift 2 ;;
    --out) RESULTS="$2"; shift 2 ;;
    --bundle) BUNDLE="$(cd "$2" && pwd)"; SKIP_BUILD=1; shift 2 ;;
    *) echo "gpu_disagg_runs.sh: unknown flag $1" >&2; exit 2 ;;
  esac
done
if [ "$SKIP_BUILD" = 0 ]; then
  scripts/install_deps.sh
  SLUICE_CUDA=ON scripts/build.sh
fi
has() { [[ ",$PARTS," == *",$1,"* ]]; }
if [ -n "$BUNDLE" ]; then
  [ -f "$BUNDLE/bundle.tar.xz" ] && [ ! -x "$BUNDLE/sluice" ] && tar -xJf "$BUNDLE/bundle.tar.xz" -C "$BUNDLE"
  # kv_transfer_bench.py finds its binaries as BUILD/bin/NAME.
  BUILD="$BUNDLE/build"
  mkdir -p "$BUILD/bin"
  for b in sluice kv_transfer_bench; do ln -sf "$BUNDLE/$b" "$BUILD/bin/$b"; done
  export UCX_MODULE_DIR="$BUNDLE/lib/ucx"
  for d in /usr/local/cuda/lib64 /usr/local/cuda/targets/x86_64-linux/lib; do
    if [ -e "$d/libcublasLt.so.13" ]; then export LD_LIBRARY_PATH="$d:${LD_LIBRARY_PATH:-}"; break; fi
  done
  UCX_LIB="$BUNDLE/lib"
  PERFTEST="$BUNDLE/ucx_perftest"
  PY=python3
else
  BUILD="$PWD/build"
  ldd "$BUILD/bin/sluice" | grep -q ucx-cu13 || {
    echo "gpu_disagg_runs.sh: $BUILD/bin/sluice does not link the CUDA-aware UCX (.deps/ucx-cu13)" >&2
    exit 1
  }
  UCX_LIB="$PWD/.deps/ucx-cu13/libucx/lib"
  PERFTEST="$PWD/.deps/ucx-cu13/libucx/bin/ucx_perftest"
  PY=.venv/bin/python
fi
export SLUICE_BIN="$BUILD/bin/sluice"
NGPU=$(nvidia-smi -L | wc -l)
SHARED="${SLUICE_SHARED_DIR:-$PWD/../shared}"
if [ -n "$MODEL_LIST" ]; then
  read -r -a MODELS <<< "$MODEL_LIST"
else
  MODELS=(models/sluice-mini-moe "$SHARED/fixtures/llama-tiny" "$SHARED/fixtures/deepseek-v3-tiny"
          "$SHARED/fixtures/qwen3-hybrid-tiny" "$SHARED/models/sluice-mini-swa")
fi
FAILED=0
mkdir -p "$RESULTS"
for model in "${MODELS[@]}"; do
  has equality || break
  name=$(basename "$model")
  for mode in pull push layerwise; do
    GPU_SETS=("")
    [ "$NGPU" -ge 2 ] && GPU_SETS+=("0,1")
    for gpus in "${GPU_SETS[@]}"; do
      tag="${name}_${mode}${gpus:+_2gpu}"
      echo "== equality $tag"
      if ! "$PY" bench/gpu_disagg_equality.py --model "$model" --mode "$mode" \
          --requests "$REQUESTS" ${gpus:+--gpus "$gpus"} \
          --out "$RESULTS/gpu_disagg_equality_${tag}_h200.json"; then
        FAILED=1
      fi
    done
  done
  # The same with --batch-invariant on `sluice serve` and both workers: every kernel is batch
  # invariant, so the concurrent pass must be token for token too (without it a near-tied token
  # or MoE expert may flip between differently batched steps: reported, not judged).
  for mode in pull push layerwise; do
    echo "== equality ${name}_${mode}_batch_invariant"
    if ! "$PY" bench/gpu_disagg_equality.py --model "$model" --mode "$mode" \
        --requests "$REQUESTS" --worker-args=--batch-invariant \
        --out "$RESULTS/gpu_disagg_equality_${name}_${mode}_batch_invariant_h200.json"; then
      FAILED=1
    fi
  done
  # Push race checks (H100, sluice-mini-moe: 4 of 16 sequential requests differed in push
  # mode, none in pull or layerwise, every transfer ok). late_start: every push starts 200 ms
  # late (mismatches that vanish: the push read KV still being written); late_complete: decode
  # starts 200 ms after the push reported done (mismatches that vanish: KV still landing). The
  # plain push run again with UCX's protocol choices in the worker logs (UCX_PROTO_INFO).
  for check in "late_start --test-transfer-delay-ms" "late_complete --test-post-transfer-delay-ms"; do
    read -r what flag <<< "$check"
    echo "== equality ${name}_push_${what}"
    if ! "$PY" bench/gpu_disagg_equality.py --model "$model" --mode push \
        --requests "$REQUESTS" --decode-args "$flag 200" \
        --out "$RESULTS/gpu_disagg_equality_${name}_push_${what}_h200.json"; then
      FAILED=1
    fi
  done
  # The prefill worker's device KV through its own pinned host staging (--kv-staging on:
  # CudaDeviceCopier lanes, then UCX RMA from the staging slots), push and layerwise.
  for mode in push layerwise; do
    echo "== equality ${name}_${mode}_staged"
    if ! "$PY" bench/gpu_disagg_equality.py --model "$model" --mode "$mode" \
        --requests "$REQUESTS" --prefill-args "--kv-staging on" \
        --out "$RESULTS/gpu_disagg_equality_${name}_${mode}_staged_h200.json"; then
      FAILED=1
    fi
  done
  # Pull mode with the decode worker's device KV unregistered: each pull RMA-reads the prefill
  # worker's KV into the decode worker's pinned host slots, then CudaDeviceCopier copies it host
  # -> device while the next chunk is read (--kv-staging on on the decode worker). 1 MiB slots:
  # the longer prompts' layers take several chunks. The report's `staging` checks every pulled
  # byte went through the slots with no failed pull and no recompute.
  echo "== equality ${name}_pull_staged"
  if ! "$PY" bench/gpu_disagg_equality.py --model "$model" --mode pull \
      --requests "$REQUESTS" --decode-args "--kv-staging on --kv-staging-slot-bytes 1048576" \
      --out "$RESULTS/gpu_disagg_equality_${name}_pull_staged_h200.json"; then
    FAILED=1
  fi
  echo "== equality ${name}_push_protoinfo"
  if ! UCX_PROTO_INFO=y "$PY" bench/gpu_disagg_equality.py --model "$model" --mode push \
      --requests "$REQUESTS" --logs-dir "$RESULTS/logs_${name}_push_protoinfo" \
      --out "$RESULTS/gpu_disagg_equality_${name}_push_protoinfo_h200.json"; then
    FAILED=1
  fi
  # SWA bounded replay, for models with sliding-window layers: R = the exactness bound
  # (layers_sliding x (window - 1) + 1), where replay is exact up to rounding.
  exact=$("$PY" -c 'import sys; sys.path.insert(0, "bench"); import gpu_disagg_equality as g
n, full, sliding, window, _ = g.swa_layout(sys.argv[1]); print(sliding * (window - 1) + 1 if sliding else 0)' "$model")
  if [ "$exact" -gt 0 ]; then
    for mode in pull push layerwise; do
      echo "== equality ${name}_${mode}_swa_replay (R=$exact)"
      if ! "$PY" bench/gpu_disagg_equality.py --model "$model" --mode "$mode" \
          --requests "$REQUESTS" --swa-replay-tokens "$exact" \
          --out "$RESULTS/gpu_disagg_equality_${name}_${mode}_swa_replay_h200.json"; then
        FAILED=1
      fi
    done
  fi
  # The kvstore behind the prefill worker's GPU cache: a fresh worker's second pass of the
  # same prompts is served from the store.
  echo "== equality ${name}_pull_kvstore"
  if ! "$PY" bench/gpu_disagg_equality.py --model "$model" --mode pull --kvstore \
      --requests "$REQUESTS" --out "$RESULTS/gpu_disagg_equality_${name}_pull_kvstore_h200.json"; then
    FAILED=1
  fi
done
for run in "cuda sm,cuda_ipc,cuda_copy cuda_ipc" "cuda tcp,cuda_copy tcp_staged" "host sm host_sm"; do
  has transfer || break
  read -r memory tls tag <<< "$run"
  echo "== transfer $tag ($memory memory, UCX_TLS=$tls)"
  LD_LIBRARY_PATH="$UCX_LIB:${LD_LIBRARY_PATH:-}" "$PY" bench/kv_transfer_bench.py --build "$BUILD" --memory "$memory" \
    --tls "$tls" --perftest "$PERFTEST" --repeats "$REPEATS" --parts transfer \
    --out "$RESULTS/kv_transfer_${tag}_h200.json" \
    --plot "$RESULTS/kv_transfer_${tag}_h200.png" || FAILED=1
done
if has staged; then
  echo "== Sluice's own staging (device KV through pinned host slots, copies overlapping tcp)"
  for op in pull push; do
    UCX_LOG_LEVEL=error "$BUILD/bin/kv_transfer_bench" --op=$op --memory=cuda --staged_slots=2 \
      --transports=tcp
  done | tee "$RESULTS/kv_transfer_staged_tcp_h200.jsonl" || FAILED=1
fi
if has handover; then
  echo "== handover (router + prefill + decode on the GPU, pull, push and layerwise)"
  "$PY" bench/kv_transfer_bench.py --build "$BUILD" --parts handover --perftest "$PERFTEST" \
    --handover-modes pull,push,layerwise --handover-prompt-words 200 \
    --tls sm,cuda_ipc,cuda_copy,tcp --handover-model "${MODELS[0]}" \
    --handover-worker-args "--device cuda --gpu-memory-utilization 0.4" \
    --out "$RESULTS/kv_handover_h200.json" || FAILED=1
fi
if has faults; then
  echo "== faults (kill -9 of decode mid-stream, of prefill mid-transfer; CUDA workers)"
  "$PY" bench/gpu_disagg_faults.py --model "${MODELS[0]}" \
    --out "$RESULTS/gpu_disagg_faults_$(basename "${MODELS[0]}")_h200.json" || FAILED=1
fi
exit "$FAILED"
