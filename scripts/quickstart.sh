#!/usr/bin/env bash
# One command for a new user: install, build, and serve the embedded default model with the
# OpenAI API on port ${PORT:-8000}.
set -euo pipefail
cd "$(dirname "$0")/.."
SLUICE_SKIP_PYTHON=1 scripts/install_deps.sh
scripts/build.sh
PORT="${PORT:-8000}"
cat <<MSG

Sluice is starting on http://127.0.0.1:${PORT} with models/sluice-mini-moe. Try:

  curl http://127.0.0.1:${PORT}/v1/chat/completions -H 'Content-Type: application/json' \\
    -d '{"model": "sluice-mini-moe", "messages": [{"role": "user", "content": "Quote Genesis 1:3."}], "max_tokens": 48}'

MSG
exec build/bin/sluice serve --model models/sluice-mini-moe --host 127.0.0.1 --port "$PORT" "$@"
