# Sourced by the start scripts: MEMT_PYTHON, unless set, is the project's .venv/bin/python when it
# exists (scripts/setup.sh makes it), else python3 on PATH.
if [ -z "${MEMT_PYTHON:-}" ]; then
    MEMT_PYTHON=python3
    _memt_root=$(CDPATH='' cd -- "$(dirname -- "$0")/.." && pwd)
    if [ -x "$_memt_root/.venv/bin/python" ]; then
        MEMT_PYTHON="$_memt_root/.venv/bin/python"
    fi
fi
