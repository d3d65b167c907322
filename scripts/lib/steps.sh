# Sourced by the one-command device runs (scripts/bench/gpu.sh, scripts/train_gpu.sh): each step of a run bounded by
# what is left of its time budget and recorded in a summary. The caller sets OUT (the outputs' folder) and BUDGET
# (seconds) first; sourcing starts the clock (START) and an empty $OUT/summary.txt (SUMMARY).
mkdir -p "$OUT"
START=$(date +%s)
SUMMARY=$OUT/summary.txt
: >"$SUMMARY"

# note TEXT...: print a line and add it to the summary
note() { echo "$*" | tee -a "$SUMMARY"; }
# left: seconds left of the budget
left() { echo $((BUDGET - ($(date +%s) - START))); }
# step NAME CAP RESERVE LOG COMMAND...: run COMMAND with at most CAP seconds, leaving RESERVE for later steps
step() {
    local name=$1 cap=$2 reserve=$3 log=$4
    shift 4
    local limit=$(($(left) - reserve))
    ((limit > cap)) && limit=$cap
    if ((limit < 20)); then
        note "$name: skipped (${limit}s left for it)"
        return 0
    fi
    local began=$(date +%s)
    echo "### $name: $* (at most ${limit}s)" >>"$log"
    timeout --kill-after=10 "$limit" "$@" >>"$log" 2>&1
    local rc=$?
    note "$name: exit $rc in $(($(date +%s) - began))s$([ $rc = 124 ] && echo ' (timed out)')"
    return 0
}

# machine FILE MODULE...: add the GPU (nvidia-smi), Python, torch and each module's version (or MISSING) to FILE;
# the caller sets PY (the Python to run)
machine() {
    local file=$1
    shift
    {
        if command -v nvidia-smi >/dev/null; then
            nvidia-smi -L 2>&1
            nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv 2>&1
        else
            echo "no nvidia-smi"
        fi
        echo "python: $($PY --version 2>&1)"
        $PY - "$@" <<'PYTHON' 2>&1
import importlib, sys, torch
print("torch", torch.__version__, "cuda", torch.version.cuda, "available", torch.cuda.is_available(),
      torch.cuda.get_device_name(0) if torch.cuda.is_available() else "")
for name in sys.argv[1:]:
    try:
        module = importlib.import_module(name)
        print(name, getattr(module, "__version__", "installed"))
    except Exception as exc:
        print(name, "MISSING", type(exc).__name__)
PYTHON
    } >>"$file"
}
