#!/usr/bin/env bash
# Serving benchmark with aiperf (bench/serve_bench.py): installs the pinned aiperf into
# bench/.venv-serve on first use, then runs the benchmark with the given arguments.
#   bench/serve_bench.sh --out bench/results/serve_bench_cpu.json
#   bench/serve_bench.sh --device cuda --model DIR --out bench/results/serve_bench_h200.json
# SLUICE_WHEELHOUSE=DIR installs offline from bench/serve/make_wheelhouse.sh's wheels.
set -euo pipefail
cd "$(dirname "$0")/.."
venv=bench/.venv-serve
stamp="$venv/.installed-$(sha256sum bench/serve/requirements.txt | cut -c1-16)"
if [[ ! -f "$stamp" ]]; then
  if [[ -n "${SLUICE_WHEELHOUSE:-}" ]]; then
    # Offline (a machine without network): the wheels bench/serve/make_wheelhouse.sh fetched,
    # on top of this machine's own packages for those it left out.
    python3 -m venv --system-site-packages "$venv"
    links=(--find-links "$SLUICE_WHEELHOUSE")
    for part in "$SLUICE_WHEELHOUSE"/part*/; do
      [[ -d "$part" ]] && links+=(--find-links "$part")
    done
    "$venv/bin/pip" install -q --no-index "${links[@]}" -r bench/serve/requirements.txt
  else
    python3 -m venv "$venv"
    "$venv/bin/pip" install -q -r bench/serve/requirements.txt
  fi
  touch "$stamp"
fi
exec "$venv/bin/python" bench/serve_bench.py "$@"
