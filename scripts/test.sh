#!/usr/bin/env bash
# Install the project into .venv (scripts/setup.sh) and run the tests (CPU only).
# Usage: bash scripts/test.sh [--quick] [PYTEST ARGUMENTS...]
#   (no option)  the whole suite: about 25 minutes on 2 cores (what CI's .ci/run runs)
#   --quick      unit tests (tests/ without e2e, reliability and demo, less the torch.compile tests) and
#                3 fast live tests: about 4 minutes on 2 busy cores
# Other arguments go to pytest, e.g. `bash scripts/test.sh -k proxy -x`.
set -euo pipefail
cd "$(dirname "$0")/.."
QUICK=0
ARGS=()
for arg in "$@"; do
  case "$arg" in
    --quick) QUICK=1 ;;
    -h|--help) sed -n '2,7p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) ARGS+=("$arg") ;;
  esac
done
bash scripts/setup.sh dev
if [ "$QUICK" = 1 ]; then
  echo "test: the quick subset (unit tests and 3 live tests)"
  exec .venv/bin/python -m pytest tests \
    --ignore=tests/e2e --ignore=tests/reliability --ignore=tests/demo \
    -k "not (test_torch_engine and compiled)" \
    tests/e2e/test_native_http.py::test_health_identity_capabilities \
    tests/e2e/test_proxy_chat.py::test_chat_completion_shape_and_usage \
    tests/e2e/test_demo.py::test_reset_forgets \
    ${ARGS[@]+"${ARGS[@]}"}
fi
exec .venv/bin/python -m pytest ${ARGS[@]+"${ARGS[@]}"}
