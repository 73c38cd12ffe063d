#!/usr/bin/env bash
# Starts a disaggregated Sluice on loopback: one router, N prefill and M decode workers, each its
# own process with its own log under the run directory; waits until the router answers /health
# and every worker has registered (GET /v1/workers), then prints the endpoint.
#
#   deploy/local/up.sh [--prefill N] [--decode M] [--model DIR] [--port P] [--run-dir DIR]
#                      [--bin PATH] [--timeout SECONDS] [--kvstore N] [--tp N] [--ep N]
#                      [--device cpu|cuda] [--gpus LIST] [--gpu-memory-utilization F]
#                      [--encoder N] [--prefill-args "FLAGS"] [--decode-args "FLAGS"]
#                      [-- extra worker flags...]
# --prefill-args / --decode-args: flags for that pool only (split on spaces), e.g.
# --decode-args "--kv-staging on" with -- --kv-transfer-mode pull; flags after -- go to every
# prefill and decode worker.
# --device cuda: the prefill and decode workers run the CUDA engine (the router stays on the
# CPU); their KV moves GPU to GPU over UCX (cuda_ipc on this host). --gpus LIST (e.g. 0,1)
# gives worker k the GPU LIST[k mod len] through CUDA_VISIBLE_DEVICES (prefill workers first,
# then decode); without it every worker shares the visible GPUs' first one, each taking
# --gpu-memory-utilization (default 0.4 with --device cuda, so a prefill and a decode worker
# fit on one GPU).
# --tp N / --ep N (default 1): every prefill and decode worker is one process holding N ranks of
# its model replica (--tensor-parallel-size / --expert-parallel-size; on the CPU the ranks are
# threads). A layout the model cannot take makes the workers exit 2 at start-up.
# --kvstore N (default 0) first starts N kvstore shards (kvstore.sh, gRPC from PORT+1501) and
# gives their list to the prefill workers (--kvstore): prompt KV is loaded from and written
# through to them. Their SSD tier stays in RUN_DIR/kvstore-data across runs.
# --encoder N (default 0) starts N vision encoders (`sluice encoder`, gRPC from PORT+1801,
# /metrics from PORT+1901) that register with the router: with a LLaVA --model folder the router
# sends them the images of each request (embeddings go to prefill/decode inline in gRPC).
# Prints the router's id of each worker (RUN_DIR/workers: process name, gRPC address, router id):
# the router numbers workers as they register, so "decode-1" here may be "decode-3" there.
# Stop with deploy/local/down.sh [--run-dir DIR].
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/../.." && pwd)"
PREFILL=1
DECODE=1
MODEL="$ROOT/models/sluice-mini-moe"
PORT=8000
RUN_DIR="${SLUICE_RUN_DIR:-${TMPDIR:-/tmp}/sluice-local}"
BIN="${SLUICE_BIN:-$ROOT/build/bin/sluice}"
TIMEOUT=300
KVSTORE=0
ENCODER=0
TP=1
EP=1
DEVICE=cpu
GPUS=""
GPU_MEM=""
WORKER_ARGS=()
PREFILL_ONLY_ARGS=()
DECODE_ONLY_ARGS=()
while [ $# -gt 0 ]; do
  case "$1" in
    --prefill) PREFILL="$2"; shift 2 ;;
    --decode) DECODE="$2"; shift 2 ;;
    --model) MODEL="$2"; shift 2 ;;
    --port) PORT="$2"; shift 2 ;;
    --run-dir) RUN_DIR="$2"; shift 2 ;;
    --bin) BIN="$2"; shift 2 ;;
    --timeout) TIMEOUT="$2"; shift 2 ;;
    --kvstore) KVSTORE="$2"; shift 2 ;;
    --encoder) ENCODER="$2"; shift 2 ;;
    --tp) TP="$2"; shift 2 ;;
    --ep) EP="$2"; shift 2 ;;
    --device) DEVICE="$2"; shift 2 ;;
    --gpus) GPUS="$2"; shift 2 ;;
    --gpu-memory-utilization) GPU_MEM="$2"; shift 2 ;;
    --prefill-args) read -r -a PREFILL_ONLY_ARGS <<< "$2"; shift 2 ;;
    --decode-args) read -r -a DECODE_ONLY_ARGS <<< "$2"; shift 2 ;;
    --) shift; WORKER_ARGS=("$@"); break ;;
    -h|--help) sed -n '2,27p' "$0"; exit 0 ;;
    *) echo "up.sh: unknown flag $1" >&2; exit 2 ;;
  esac
done
[ -x "$BIN" ] || { echo "up.sh: no sluice binary at $BIN (build it or set SLUICE_BIN)" >&2; exit 1; }
if [ -f "$RUN_DIR/pids" ]; then
  echo "up.sh: $RUN_DIR/pids exists; run down.sh --run-dir $RUN_DIR first" >&2
  exit 1
fi
mkdir -p "$RUN_DIR"

# Ports: the router's registry at PORT+1000; worker gRPC from PORT+1100 (prefill) and PORT+1200
# (decode); worker HTTP (/metrics, /health) from PORT+1300 (prefill) and PORT+1400 (decode).
GRPC_PORT=$((PORT + 1000))
METRICS_URLS=()
WORKER_ADDRS=()  # "NAME ADDRESS" of each worker started: matched to the router's ids at the end
: > "$RUN_DIR/pids"
start() {  # start NAME ARGS...: runs one service in the background, logs to RUN_DIR/NAME.log
  local name="$1"; shift
  "$@" > "$RUN_DIR/$name.log" 2>&1 &
  echo "$! $name" >> "$RUN_DIR/pids"
}
PREFILL_ARGS=()
PARALLEL_ARGS=(--tensor-parallel-size "$TP" --expert-parallel-size "$EP")
case "$DEVICE" in
  cpu) DEVICE_ARGS=() ;;
  cuda) DEVICE_ARGS=(--device cuda --gpu-memory-utilization "${GPU_MEM:-0.4}") ;;
  *) echo "up.sh: --device must be cpu or cuda, not $DEVICE" >&2; exit 2 ;;
esac
IFS=',' read -r -a GPU_LIST <<< "$GPUS"
WORKER_INDEX=0
next_gpu_env() {  # sets ENV_ARG, the next worker's env assignment: its GPU from --gpus
  if [ "$DEVICE" = cuda ] && [ ${#GPU_LIST[@]} -gt 0 ]; then
    ENV_ARG="CUDA_VISIBLE_DEVICES=${GPU_LIST[$((WORKER_INDEX % ${#GPU_LIST[@]}))]}"
  else
    ENV_ARG="SLUICE_UP_DEVICE=$DEVICE"  # a harmless placeholder: env needs one assignment
  fi
  WORKER_INDEX=$((WORKER_INDEX + 1))
}
if [ "$KVSTORE" -gt 0 ]; then
  "$ROOT/deploy/local/kvstore.sh" --shards "$KVSTORE" --port $((PORT + 1500)) --run-dir "$RUN_DIR" \
    --bin "$BIN" || { "$ROOT/deploy/local/down.sh" --run-dir "$RUN_DIR" >/dev/null 2>&1 || true; exit 1; }
  PREFILL_ARGS=(--kvstore "$(cat "$RUN_DIR/kvstore_shards")")
fi
# Refuse ports something already listens on: otherwise another instance's router could answer
# the readiness checks below while this one's services die on "address in use".
port_in_use() { (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }
PORTS=("$PORT" "$GRPC_PORT")
for i in $(seq 1 "$PREFILL"); do PORTS+=("$((PORT + 1100 + i))" "$((PORT + 1300 + i))"); done
for i in $(seq 1 "$DECODE"); do PORTS+=("$((PORT + 1200 + i))" "$((PORT + 1400 + i))"); done
for i in $(seq 1 "$ENCODER"); do PORTS+=("$((PORT + 1800 + i))" "$((PORT + 1900 + i))"); done
for p in "${PORTS[@]}"; do
  if port_in_use "$p"; then
    echo "up.sh: port $p on 127.0.0.1 is already in use (another instance? see down.sh, or pick" \
      "another --port; each instance uses PORT, PORT+1000 and PORT+1101..PORT+1999)" >&2
    "$ROOT/deploy/local/down.sh" --run-dir "$RUN_DIR" >/dev/null 2>&1 || true
    exit 1
  fi
done
start router "$BIN" router --model "$MODEL" --host 127.0.0.1 --port "$PORT" \
  --grpc-host 127.0.0.1 --grpc-port "$GRPC_PORT"
for i in $(seq 1 "$PREFILL"); do
  next_gpu_env
  start "prefill-$i" env "$ENV_ARG" "$BIN" prefill --model "$MODEL" \
    --listen "127.0.0.1:$((PORT + 1100 + i))" \
    --router "127.0.0.1:$GRPC_PORT" --http-port "$((PORT + 1300 + i))" "${PREFILL_ARGS[@]}" \
    "${PARALLEL_ARGS[@]}" "${DEVICE_ARGS[@]}" "${WORKER_ARGS[@]}" "${PREFILL_ONLY_ARGS[@]}"
  METRICS_URLS+=("prefill-$i http://127.0.0.1:$((PORT + 1300 + i))/metrics")
  WORKER_ADDRS+=("prefill-$i 127.0.0.1:$((PORT + 1100 + i))")
done
for i in $(seq 1 "$DECODE"); do
  next_gpu_env
  start "decode-$i" env "$ENV_ARG" "$BIN" decode --model "$MODEL" \
    --listen "127.0.0.1:$((PORT + 1200 + i))" \
    --router "127.0.0.1:$GRPC_PORT" --http-port "$((PORT + 1400 + i))" "${PARALLEL_ARGS[@]}" \
    "${DEVICE_ARGS[@]}" "${WORKER_ARGS[@]}" "${DECODE_ONLY_ARGS[@]}"
  METRICS_URLS+=("decode-$i http://127.0.0.1:$((PORT + 1400 + i))/metrics")
  WORKER_ADDRS+=("decode-$i 127.0.0.1:$((PORT + 1200 + i))")
done

for i in $(seq 1 "$ENCODER"); do
  start "encoder-$i" "$BIN" encoder --model "$MODEL" --listen "127.0.0.1:$((PORT + 1800 + i))" \
    --router "127.0.0.1:$GRPC_PORT" --http-port "$((PORT + 1900 + i))"
  METRICS_URLS+=("encoder-$i http://127.0.0.1:$((PORT + 1900 + i))/metrics")
  WORKER_ADDRS+=("encoder-$i 127.0.0.1:$((PORT + 1800 + i))")
done

URL="http://127.0.0.1:$PORT"
WANT=$((PREFILL + DECODE + ENCODER))
deadline=$((SECONDS + TIMEOUT))
while :; do
  while read -r pid name; do
    if ! kill -0 "$pid" 2>/dev/null; then
      echo "up.sh: $name (pid $pid) exited; last lines of $RUN_DIR/$name.log:" >&2
      tail -n 20 "$RUN_DIR/$name.log" >&2
      "$ROOT/deploy/local/down.sh" --run-dir "$RUN_DIR" >/dev/null 2>&1 || true
      exit 1
    fi
  done < "$RUN_DIR/pids"
  registered=$(curl -sf --max-time 2 "$URL/v1/workers" 2>/dev/null |
    python3 -c 'import json,sys; print(sum(1 for w in json.load(sys.stdin)["data"] if not w["draining"]))' \
    2>/dev/null || echo 0)
  if [ "$registered" -ge "$WANT" ] && curl -sf --max-time 2 "$URL/health" >/dev/null 2>&1; then
    break
  fi
  if [ "$SECONDS" -ge "$deadline" ]; then
    echo "up.sh: not ready after ${TIMEOUT}s ($registered/$WANT workers registered); logs in $RUN_DIR" >&2
    "$ROOT/deploy/local/down.sh" --run-dir "$RUN_DIR" >/dev/null 2>&1 || true
    exit 1
  fi
  sleep 0.5
done
echo "$URL" > "$RUN_DIR/endpoint"
echo "Sluice is up: $URL/v1 (router + $PREFILL prefill + $DECODE decode + $ENCODER encoder on $DEVICE, TP=$TP EP=$EP; logs in $RUN_DIR)"
echo "Metrics: router $URL/metrics"
for entry in "${METRICS_URLS[@]}"; do echo "  $entry"; done
# The router numbers workers in the order they registered (and anew when one re-registers), so
# its ids (in /v1/workers, /metrics and its logs) need not match these process names: print and
# keep (RUN_DIR/workers) which is which, by gRPC address.
curl -sf --max-time 5 "$URL/v1/workers" | python3 -c '
import json, sys
ids = {w["address"]: w["id"] for w in json.load(sys.stdin)["data"]}
for entry in sys.argv[1:]:
    name, address = entry.split()
    print(name, address, ids.get(address, "?"))
' "${WORKER_ADDRS[@]}" > "$RUN_DIR/workers" || true
echo "Workers (process and log name, gRPC address, the router's id for it):"
while read -r name address id; do echo "  $name $address $id"; done < "$RUN_DIR/workers"
