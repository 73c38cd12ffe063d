#!/usr/bin/env bash
# Stops what deploy/local/up.sh started (the pids in RUN_DIR/pids): SIGTERM, then SIGKILL after
# a grace period, then removes the pid file (logs stay).
#   deploy/local/down.sh [--run-dir DIR] [--grace SECONDS]
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/../.." && pwd)"
RUN_DIR="${SLUICE_RUN_DIR:-${TMPDIR:-/tmp}/sluice-local}"
GRACE=40  # covers the workers' default --drain-timeout-s (30) and the router's own drain
while [ $# -gt 0 ]; do
  case "$1" in
    --run-dir) RUN_DIR="$2"; shift 2 ;;
    --grace) GRACE="$2"; shift 2 ;;
    *) echo "down.sh: unknown flag $1" >&2; exit 2 ;;
  esac
done
PIDS_FILE="$RUN_DIR/pids"
[ -f "$PIDS_FILE" ] || { echo "down.sh: nothing running ($PIDS_FILE not found)"; exit 0; }
# Workers first (they drain and deregister), the router last.
tac "$PIDS_FILE" | while read -r pid name; do kill -TERM "$pid" 2>/dev/null || true; done
deadline=$((SECONDS + GRACE))
while [ "$SECONDS" -lt "$deadline" ]; do
  alive=0
  while read -r pid name; do kill -0 "$pid" 2>/dev/null && alive=1; done < "$PIDS_FILE"
  [ "$alive" -eq 0 ] && break
  sleep 0.2
done
while read -r pid name; do
  if kill -0 "$pid" 2>/dev/null; then
    echo "down.sh: $name (pid $pid) ignored SIGTERM for ${GRACE}s; killing" >&2
    kill -KILL "$pid" 2>/dev/null || true
  fi
done < "$PIDS_FILE"
rm -f "$PIDS_FILE" "$RUN_DIR/endpoint"
echo "Sluice stopped (logs kept in $RUN_DIR)"
