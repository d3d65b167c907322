#!/usr/bin/env bash
# Issue 47's GPU training as one command: check the batched trainer on the GPU, time it, continue a demo checkpoint
# with it for the rest of the budget, and leave the checkpoint in $OUT as one archive.
#
#   scripts/train_gpu.sh                                # outputs in $OUT, else ./train-run-<date>
#   WHEELS=/path/to/wheels scripts/train_gpu.sh         # first install what the host lacks from a folder of wheels
#                                                       # (scripts/bench/gpu_wheels.sh downloads them)
#   DEVICE=cpu BUDGET=120 STEPS=2 scripts/train_gpu.sh  # a dry run of the script itself, where no GPU is
#
# Settings: BUDGET seconds in all (default 520); INIT the checkpoint to continue (default
# runs/demo-v3/m128-avg-316min, the best of the wider memory's CPU runs: runs/README.md); BATCH episodes per step
# (default 256); LR the peak learning rate (default 1e-3); SEED (default 21); STEPS the most steps (default: as many
# as the time allows); MIX extra `--mix FIELD=VALUE` words for scripts/train_tiny.py.
# Outputs (6 files; a device machine gives back at most 8):
#   summary.txt         each step's exit status and seconds, and the key lines
#   env.txt             the machine, Python and package versions
#   tests.log           the demo trainer's GPU tests (the batched loss on the GPU equals the CPU reference's)
#   trainer.txt         scripts/bench/trainer.py on the device: steps/s of both trainers at batch 64 and $BATCH
#   train.log           scripts/train_tiny.py's log
#   checkpoint.tar.gz   the trained checkpoint: `tar -xzf checkpoint.tar.gz` makes ./checkpoint/, then
#                       `python scripts/eval_tiny.py --model-path checkpoint --split heldout ...` (docs/demo-model.md)
set -uo pipefail
cd "$(dirname "$0")/.." || exit 2
ROOT=$(pwd)
OUT=${OUT:-$ROOT/train-run-$(date +%Y%m%d-%H%M%S)}
BUDGET=${BUDGET:-520}
. scripts/lib/steps.sh
PY=${PYTHON:-python3}
DEVICE=${DEVICE:-cuda}
INIT=${INIT:-runs/demo-v3/m128-avg-316min}
BATCH=${BATCH:-256}
LR=${LR:-1e-3}
SEED=${SEED:-21}
STEPS=${STEPS:-1000000}
export PYTHONPATH="$ROOT${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT

note "issue 47 GPU training, $(date -u +%FT%TZ), budget ${BUDGET}s, device $DEVICE, from $INIT, outputs in $OUT"
: >"$OUT/env.txt"
if [ -n "${WHEELS:-}" ]; then
    step "wheels" 90 400 "$OUT/env.txt" $PY -m pip install --no-index --no-deps "$WHEELS"/*.whl
fi
machine "$OUT/env.txt" transformers tokenizers safetensors triton pytest_timeout

if [ "$DEVICE" = cuda ]; then
    step "gpu tests" 90 300 "$OUT/tests.log" $PY -m pytest -m gpu -q -rs -p no:cacheprovider -o addopts= tests/demo
    grep -sE "passed|failed|error" "$OUT/tests.log" | tail -1 | sed 's/^/  tests: /' | tee -a "$SUMMARY"
    step "trainer bench" 100 240 "$OUT/trainer.txt" $PY scripts/bench/trainer.py --device cuda --model "$INIT" \
        --batch-size 64 "$BATCH" --repeats 2
    grep -sE "^batch" "$OUT/trainer.txt" | sed 's/^/  trainer: /' | tee -a "$SUMMARY"
fi

# training: what is left, less the archive's share; train_tiny saves and stops at its time limit by itself
minutes=$(awk -v s=$(($(left) - 45)) 'BEGIN { printf "%.2f", s / 60 }')
step "training" $(($(left) - 15)) 15 "$OUT/train.log" $PY scripts/train_tiny.py --init-from "$INIT" --out "$WORK/checkpoint" \
    --device "$DEVICE" --batched --batch-size "$BATCH" --lr "$LR" --seed "$SEED" --steps "$STEPS" --threads 4 \
    --time-limit-min "$minutes" --schedule-by-time --warm-up 0 --full-mix 0.01 --eval-episodes 0 --log-every 10 \
    ${MIX:+--mix $MIX}
grep -sE "^step|time limit" "$OUT/train.log" | tail -2 | cut -c1-400 | sed 's/^/  training: /' | tee -a "$SUMMARY"
if [ -f "$WORK/checkpoint/model.safetensors" ]; then
    tar -czf "$OUT/checkpoint.tar.gz" -C "$WORK" checkpoint
    note "checkpoint: $(du -h "$OUT/checkpoint.tar.gz" | cut -f1) in checkpoint.tar.gz"
else
    note "no checkpoint was saved: see train.log"
fi
note "done in $(($(date +%s) - START))s"
