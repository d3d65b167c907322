#!/usr/bin/env bash
# Install the project into .venv (scripts/setup.sh) and run the whole test suite (CPU only).
# Extra arguments go to pytest, e.g. `bash scripts/test.sh -k proxy -x`.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh dev
exec .venv/bin/python -m pytest "$@"
