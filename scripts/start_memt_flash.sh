#!/bin/sh
# Serve MemT-1.0-Flash over memt-http-v1 with the example settings of the spec's table.
#
#   sh scripts/start_memt_flash.sh /models/MemT-1.0-Flash [extra launcher arguments ...]
#
# Environment: MEMT_PYTHON (default: the project's .venv/bin/python, else python3), MEMT_PORT (default 30000), MEMT_STATE_DIRECTORY (default
# ./memt-state), CUDA_VISIBLE_DEVICES (default 0,1,2,3,4,5,6,7). Extra arguments come last, so they
# override the values below (the launcher's startup checks still apply). Try --dry-run first.
# Parallel settings: TP/EP/DP 8/8/8 with DP attention (the seed's); --dry-run prints what each rank holds.
# With DP attention each GPU runs attention and latent memory for its own sessions (6 a rank, 48 in all) and an
# eighth of the experts; docs/deployment.md (parallel serving) says what runs where.
# The seed's budgets, with its FP8 KV cache (--kv-cache-dtype fp8_e4m3; docs/deployment.md, memory budget).
set -eu

if [ "$#" -lt 1 ]; then
    echo "usage: sh $0 CHECKPOINT_DIRECTORY [launcher arguments ...]" >&2
    exit 2
fi
MODEL_PATH=$1
shift

CUDA_VISIBLE_DEVICES=${CUDA_VISIBLE_DEVICES:-0,1,2,3,4,5,6,7}
export CUDA_VISIBLE_DEVICES

. "$(dirname -- "$0")/lib/python.sh"  # MEMT_PYTHON: the project's .venv, else python3

exec "$MEMT_PYTHON" -m memt_core.launch \
    --model-path "$MODEL_PATH" \
    --host 127.0.0.1 \
    --port "${MEMT_PORT:-30000}" \
    --state-directory "${MEMT_STATE_DIRECTORY:-./memt-state}" \
    --max-sessions-per-rank 6 \
    --max-inflight-commits-per-rank 1 \
    --min-kv-tokens 2048 \
    --max-prefill-tokens 16384 \
    --tp-size 8 \
    --ep-size 8 \
    --dp-size 8 \
    --enable-dp-attention \
    --max-total-tokens 65536 \
    --mem-fraction-static 0.70 \
    --kv-cache-dtype fp8_e4m3 \
    --chunked-prefill-size -1 \
    --disable-radix-cache \
    --disable-cuda-graph \
    --max-running-requests 48 \
    --context-length 16384 \
    --enable-streaming-session \
    "$@"
