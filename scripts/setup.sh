#!/usr/bin/env bash
# Create .venv with the project installed (CPU PyTorch from the package index), for the demo and the tests.
# Usage: bash scripts/setup.sh [extra]   (extra defaults to "dev": server, client, proxy and test tools)
set -euo pipefail
cd "$(dirname "$0")/.."
EXTRA="${1:-dev}"
PYTHON="${PYTHON:-python3}"
if [ ! -x .venv/bin/python ]; then
  "$PYTHON" -m venv .venv
fi
PIP=(.venv/bin/python -m pip install -q --disable-pip-version-check)
"${PIP[@]}" --upgrade pip
# Pin the CPU-friendly PyTorch first so no dependency pulls a multi-GB CUDA build (see README for GPUs).
"${PIP[@]}" "torch==2.13.0"
"${PIP[@]}" -e ".[${EXTRA}]"
# The ownership tests start a real Redis; install it from Debian's packages where we may (else they skip).
if [ "$EXTRA" = "dev" ] && ! command -v redis-server >/dev/null 2>&1 && command -v apt-get >/dev/null 2>&1 && [ "$(id -u)" = 0 ]; then
  apt-get install -y -q redis-server >/dev/null 2>&1 \
    || { apt-get update -q >/dev/null 2>&1 && apt-get install -y -q redis-server >/dev/null 2>&1; } \
    || echo "setup: redis-server could not be installed; the session-ownership tests will skip" >&2
fi
for adapter in adapters/*/; do
  if [ "$EXTRA" = "dev" ] && [ -f "${adapter}pyproject.toml" ]; then
    "${PIP[@]}" -e "${adapter}"
  fi
done
