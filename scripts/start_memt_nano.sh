#!/bin/sh
# Serve MemT-1.0-Nano over memt-http-v1 with the example settings of the spec's table.
#
#   sh scripts/start_memt_nano.sh /models/MemT-1.0-Nano [extra launcher arguments ...]
#
# Environment: MEMT_PYTHON (default: the project's .venv/bin/python, else python3), MEMT_PORT (default 30000), MEMT_STATE_DIRECTORY (default
# ./memt-state), CUDA_VISIBLE_DEVICES (default 0,1). Extra arguments come last, so they override the
# values below (the launcher's startup checks still apply). Try --dry-run first.
# Parallel settings: TP/EP/DP 2/1/1, DP attention off (the seed's); --dry-run prints what each rank holds.
# Each rank is a process (CUDA: one per visible GPU); --tp-size 1 serves on one device.
# The seed's Triton attention, linear-attention and MoE backends: this engine's kernels are named by
# --attention-backend/--linear-attn-backend/--moe-runner-backend (engine defaults here; --help lists them).
set -eu

if [ "$#" -lt 1 ]; then
    echo "usage: sh $0 CHECKPOINT_DIRECTORY [launcher arguments ...]" >&2
    exit 2
fi
MODEL_PATH=$1
shift

CUDA_VISIBLE_DEVICES=${CUDA_VISIBLE_DEVICES:-0,1}
export CUDA_VISIBLE_DEVICES

. "$(dirname -- "$0")/lib/python.sh"  # MEMT_PYTHON: the project's .venv, else python3

exec "$MEMT_PYTHON" -m memt_core.launch \
    --model-path "$MODEL_PATH" \
    --host 127.0.0.1 \
    --port "${MEMT_PORT:-30000}" \
    --state-directory "${MEMT_STATE_DIRECTORY:-./memt-state}" \
    --max-sessions-per-rank 6 \
    --max-inflight-commits-per-rank 2 \
    --min-kv-tokens 2048 \
    --max-prefill-tokens 16384 \
    --tp-size 2 \
    --ep-size 1 \
    --dp-size 1 \
    --max-total-tokens 65536 \
    --mem-fraction-static 0.60 \
    --chunked-prefill-size -1 \
    --disable-radix-cache \
    --disable-cuda-graph \
    --max-running-requests 8 \
    "$@"
