#!/bin/sh
# Start the OpenAI-compatible MemT proxy in front of a memt_core server.
# Usage: sh scripts/start_proxy.sh [CHECKPOINT_DIR] [extra python -m memt_proxy arguments]
# Environment: MEMT_PYTHON (the project's .venv/bin/python, else python3), MEMT_UPSTREAM (http://127.0.0.1:30000), MEMT_PROXY_PORT (8000),
#              MEMT_API_KEY (the upstream server's key, if it has one),
#              MEMT_PROXY_STATE (./memt-proxy-state: per-session records, so a restart keeps trimming).
set -e
. "$(dirname -- "$0")/lib/python.sh"  # MEMT_PYTHON: the project's .venv, else python3
PY="$MEMT_PYTHON"
MODEL_ARGS=""
if [ $# -gt 0 ] && [ "${1#-}" = "$1" ]; then
  MODEL_ARGS="--model-path $1"
  shift
fi
# shellcheck disable=SC2086
exec "$PY" -m memt_proxy --upstream "${MEMT_UPSTREAM:-http://127.0.0.1:30000}" \
  --host 127.0.0.1 --port "${MEMT_PROXY_PORT:-8000}" --state-directory "${MEMT_PROXY_STATE:-./memt-proxy-state}" \
  $MODEL_ARGS "$@"
