#!/usr/bin/env bash
# Serving benchmark with aiperf (bench/serve_bench.py): installs the pinned aiperf into
# bench/.venv-serve on first use, then runs the benchmark with the given arguments.
#   bench/serve_bench.sh --out bench/results/serve_bench_cpu.json
#   bench/serve_bench.sh --device cuda --model DIR --out bench/results/serve_bench_h200.json
set -euo pipefail
cd "$(dirname "$0")/.."
venv=bench/.venv-serve
stamp="$venv/.installed-$(sha256sum bench/serve/requirements.txt | cut -c1-16)"
if [[ ! -f "$stamp" ]]; then
  python3 -m venv "$venv"
  "$venv/bin/pip" install -q -r bench/serve/requirements.txt
  touch "$stamp"
fi
exec "$venv/bin/python" bench/serve_bench.py "$@"
