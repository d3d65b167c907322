#!/usr/bin/env bash
# The wheels an offline GPU host needs for scripts/bench/gpu.sh, downloaded here (where pip reaches an index) into
# one folder to carry with the tree: WHEELS=<folder> scripts/bench/gpu.sh installs them there, without an index.
#
#   scripts/bench/gpu_wheels.sh [FOLDER]      # default .gpu-wheels/ (git-ignored); PYVER=312 for the host's Python
#
# What issue 46's H200 host lacked (Python 3.12, torch 2.11 + CUDA, transformers 5.17, fla-core 0.6): the pinned
# transformers and its hub client, fastapi 0.165 with what it imports (opentelemetry-api, annotated-doc), llguidance,
# sse-starlette and swagger-ui-bundle, pytest-timeout. No dependencies are resolved (--no-deps): the host keeps its
# torch, numpy and CUDA stack; gpu.sh's env.txt lists any module still missing.
set -euo pipefail
DIR=${1:-.gpu-wheels}
PYVER=${PYVER:-312}
mkdir -p "$DIR"
python -m pip download --dest "$DIR" --no-deps --only-binary=:all: --python-version "$PYVER" \
    --platform manylinux_2_28_x86_64 --platform manylinux2014_x86_64 --platform manylinux_2_17_x86_64 \
    "transformers==5.23.0" "huggingface-hub>=1.0" "tokenizers>=0.21" "safetensors>=0.4" \
    "fastapi==0.165.0" "starlette" "opentelemetry-api" "annotated-doc" "llguidance==1.6.1" \
    "sse-starlette>=2.0" "swagger-ui-bundle>=1.1" "uvicorn>=0.29" "pytest-timeout>=2.3"
du -sh "$DIR"
