#!/usr/bin/env bash
# The main job: install into .venv (CPU PyTorch), then run the latent-memory demo on the bundled tiny model
# (one process: the proxy with the core inside it; `bash scripts/demo.sh --two-process` runs them as two).
set -euo pipefail
cd "$(dirname "$0")/.."
MEMT_SETUP_FOR=demo bash scripts/setup.sh dev  # (no notice about Redis, which only the ownership tests use)
exec .venv/bin/python scripts/demo.py "$@"
