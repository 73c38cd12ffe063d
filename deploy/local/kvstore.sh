#!/usr/bin/env bash
# Starts N kvstore shards (`sluice kvstore`) on loopback, each its own process, logging to
# RUN_DIR/kvstore-<i>.log, with its SSD tier in DATA_DIR/kvstore-<i> (kept across runs, so a
# restart serves the blocks again). Appends "<pid> kvstore-<i>" to RUN_DIR/pids (down.sh stops
# them with the rest), waits until every shard answers /health, and writes the shard list
# (comma-separated host:port, the --kvstore value workers use) to RUN_DIR/kvstore_shards.
#
#   deploy/local/kvstore.sh [--shards N] [--port P] [--run-dir DIR] [--data-dir DIR] [--bin PATH]
#                           [--dram-bytes 1G] [--ssd-bytes 8G] [--ttl-hours 72] [--timeout S]
# Shard i (1-based) listens for gRPC on P+i and serves /metrics on P+100+i (default P = 7300).
# Can run alone or be called by up.sh (same --run-dir).
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/../.." && pwd)"
SHARDS=1
PORT=7300
RUN_DIR="${SLUICE_RUN_DIR:-${TMPDIR:-/tmp}/sluice-local}"
DATA_DIR=""
BIN="${SLUICE_BIN:-$ROOT/build/bin/sluice}"
DRAM_BYTES=1G
SSD_BYTES=8G
TTL_HOURS=72
TIMEOUT=60
while [ $# -gt 0 ]; do
  case "$1" in
    --shards) SHARDS="$2"; shift 2 ;;
    --port) PORT="$2"; shift 2 ;;
    --run-dir) RUN_DIR="$2"; shift 2 ;;
    --data-dir) DATA_DIR="$2"; shift 2 ;;
    --bin) BIN="$2"; shift 2 ;;
    --dram-bytes) DRAM_BYTES="$2"; shift 2 ;;
    --ssd-bytes) SSD_BYTES="$2"; shift 2 ;;
    --ttl-hours) TTL_HOURS="$2"; shift 2 ;;
    --timeout) TIMEOUT="$2"; shift 2 ;;
    -h|--help) sed -n '2,12p' "$0"; exit 0 ;;
    *) echo "kvstore.sh: unknown flag $1" >&2; exit 2 ;;
  esac
done
[ -x "$BIN" ] || { echo "kvstore.sh: no sluice binary at $BIN" >&2; exit 1; }
DATA_DIR="${DATA_DIR:-$RUN_DIR/kvstore-data}"
mkdir -p "$RUN_DIR" "$DATA_DIR"
touch "$RUN_DIR/pids"

shard_list=()
new_pids=()
for i in $(seq 1 "$SHARDS"); do
  name="kvstore-$i"
  "$BIN" kvstore --host 127.0.0.1 --port "$((PORT + i))" \
    --metrics-host 127.0.0.1 --metrics-port "$((PORT + 100 + i))" \
    --dram-bytes "$DRAM_BYTES" --ssd-dir "$DATA_DIR/$name" --ssd-bytes "$SSD_BYTES" \
    --ttl-hours "$TTL_HOURS" > "$RUN_DIR/$name.log" 2>&1 &
  echo "$! $name" >> "$RUN_DIR/pids"
  new_pids+=("$! $name")
  shard_list+=("127.0.0.1:$((PORT + i))")
done

deadline=$((SECONDS + TIMEOUT))
for i in $(seq 1 "$SHARDS"); do
  until curl -sf --max-time 2 "http://127.0.0.1:$((PORT + 100 + i))/health" >/dev/null 2>&1; do
    for entry in "${new_pids[@]}"; do
      read -r pid name <<< "$entry"
      if ! kill -0 "$pid" 2>/dev/null; then
        echo "kvstore.sh: $name (pid $pid) exited; last lines of $RUN_DIR/$name.log:" >&2
        tail -n 20 "$RUN_DIR/$name.log" >&2
        exit 1
      fi
    done
    if [ "$SECONDS" -ge "$deadline" ]; then
      echo "kvstore.sh: kvstore-$i not healthy after ${TIMEOUT}s" >&2
      exit 1
    fi
    sleep 0.2
  done
  echo "kvstore-$i: grpc 127.0.0.1:$((PORT + i)) metrics http://127.0.0.1:$((PORT + 100 + i))/metrics"
done
(IFS=,; echo "${shard_list[*]}") > "$RUN_DIR/kvstore_shards"
echo "kvstore shards: $(cat "$RUN_DIR/kvstore_shards")"
