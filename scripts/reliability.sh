#!/usr/bin/env bash
# The reliability battery of issue 13 (fuzzing, hostile input, crashes, load) against live servers on
# 127.0.0.1. Usage: scripts/reliability.sh [--quick] [--only CHECK]... [--report FILE]
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON="${PYTHON:-.venv/bin/python}"
export OMP_NUM_THREADS="${OMP_NUM_THREADS:-1}"
exec "$PYTHON" -m scripts.reliability.battery "$@"
