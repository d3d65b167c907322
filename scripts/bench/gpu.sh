#!/usr/bin/env bash
# Issue 46's GPU run as one command: the GPU tests and the GPU benches, every output in one folder, in 8 minutes.
#
#   scripts/bench/gpu.sh                      # outputs in $OUT, else ./gpu-run-<date>
#   WHEELS=/path/to/wheels scripts/bench/gpu.sh   # first install what the host lacks from a folder of wheels
#                                              # (scripts/bench/gpu_wheels.sh downloads them where pip reaches an index)
#
# What it runs, each step bounded by what is left of BUDGET (default 470 s) and recorded in summary.txt:
#   env.txt       the machine (nvidia-smi), Python and package versions; the Nano-widths checkpoint's build
#   tests.log     every GPU-marked test (pytest -m gpu on the files that have them), each bounded
#   engine.txt    scripts/bench/engine.py --device cuda on the Nano-widths checkpoint (4 layers, 32 experts):
#                 commit vs prefill at 2,048 / 8,192 tokens, decode of 1 and 16 sessions for the reference
#                 (transformers' modules, what issue 46 measured), the fused step, and CUDA graphs, with the
#                 fraction of the bandwidth bound
#   lengths.txt   scripts/bench/lengths.py --device cuda: time to ready (the warm-up) and, after ready,
#   lengths.json  24 prompt/commit lengths each first met after ready: max / median per length
#   decode.txt    scripts/bench/decode_paths.py --device cuda: fused vs reference tokens/s and tokens (if time is left)
#   kv_dtype.txt  scripts/bench/kv_dtype.py --device cuda --dtype bfloat16: the FP8 KV cache against BF16's (issue 60)
#   launches.txt  scripts/bench/launches.py: the CPU launch count per decode step (runs on the CPU meanwhile)
#   summary.txt   each step's exit status and seconds, and the figures' key lines
# (9 files: what a device machine's $OUT gives back.)
set -uo pipefail
cd "$(dirname "$0")/../.." || exit 2
ROOT=$(pwd)
OUT=${OUT:-$ROOT/gpu-run-$(date +%Y%m%d-%H%M%S)}
BUDGET=${BUDGET:-470}
. scripts/lib/steps.sh
PY=${PYTHON:-python3}
CKPT=${CKPT:-/tmp/memt-nano-widths}
DEVICE=${DEVICE:-cuda}  # DEVICE=cpu: a dry run of the script itself, where no GPU is
export PYTHONPATH="$ROOT${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1 MEMT_TEST_STARTUP_TIMEOUT=${MEMT_TEST_STARTUP_TIMEOUT:-240}

note "issue 46 GPU run, $(date -u +%FT%TZ), budget ${BUDGET}s, outputs in $OUT"
: >"$OUT/env.txt"
if [ -n "${WHEELS:-}" ]; then
    step "wheels" 90 400 "$OUT/env.txt" $PY -m pip install --no-index --no-deps "$WHEELS"/*.whl
fi
machine "$OUT/env.txt" transformers fla causal_conv1d triton fastapi uvicorn llguidance pytest_timeout


# on the CPU meanwhile: the Nano-widths checkpoint, then the launch count
(
    $PY scripts/make_tiny_checkpoint.py "$CKPT" --widths nano --layers 4 --experts 32 >"$OUT/build.tmp" 2>&1
    echo "build exit $?" >>"$OUT/build.tmp"
    nice -n 10 timeout 300 $PY scripts/bench/launches.py --threads 4 >"$OUT/launches.txt" 2>&1
) &
CPU_JOB=$!

# the GPU tests: every file with a test marked gpu, each test bounded
mapfile -t GPU_FILES < <(grep -rl "mark.gpu" tests --include='*.py' | sort)
TIMEOUT_ARGS=()
$PY -c "import pytest_timeout" 2>/dev/null && TIMEOUT_ARGS=(--timeout 200)
step "gpu tests" 230 240 "$OUT/tests.log" $PY -m pytest -m gpu -q -rs -p no:cacheprovider -o addopts= "${TIMEOUT_ARGS[@]}" "${GPU_FILES[@]}"
grep -sE "passed|failed|error" "$OUT/tests.log" | tail -1 | sed 's/^/  tests: /' | tee -a "$SUMMARY"

wait "$CPU_JOB"
cat "$OUT/build.tmp" >>"$OUT/env.txt" && rm -f "$OUT/build.tmp"
grep -q "build exit 0" "$OUT/env.txt" || note "the Nano-widths checkpoint was not built: see env.txt"

step "engine bench" 150 120 "$OUT/engine.txt" $PY scripts/bench/engine.py --model-path "$CKPT" --device "$DEVICE" \
    --commit-tokens 2048,8192 --sessions 16 --repeats 3 --decode-modes "reference,eager$([ "$DEVICE" = cuda ] && echo ,cuda-graph)"
grep -sE "^ +[0-9]+ +[0-9,]+|decode tok/s|bandwidth bound|target" "$OUT/engine.txt" | sed 's/^/  engine: /' | tee -a "$SUMMARY"

step "lengths bench" 180 30 "$OUT/lengths.txt" $PY scripts/bench/lengths.py --model-path "$CKPT" --core-args "--device $DEVICE" \
    --ready-timeout 150 --repeats 2 --out "$OUT/lengths.json"
grep -sE "ready after|target" "$OUT/lengths.txt" | sed 's/^/  lengths: /' | tee -a "$SUMMARY"

step "decode paths" 90 45 "$OUT/decode.txt" $PY scripts/bench/decode_paths.py --device "$DEVICE" --rows 1,16 --tokens 32 --repeats 3
grep -sE "×|slowest" "$OUT/decode.txt" | sed 's/^/  decode: /' | tee -a "$SUMMARY"

step "kv dtype" 45 0 "$OUT/kv_dtype.txt" $PY scripts/bench/kv_dtype.py --device "$DEVICE" --dtype bfloat16
grep -sE "memt-" "$OUT/kv_dtype.txt" | sed 's/^/  fp8 kv vs bf16: /' | tee -a "$SUMMARY"

grep -sE "^ +[0-9]+ +[0-9,]+ |target" "$OUT/launches.txt" | sed 's/^/  launches (CPU): /' | tee -a "$SUMMARY"
note "done in $(($(date +%s) - START))s"
