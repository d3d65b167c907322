"""Live fixtures and helpers for the adapter packages' tests: the real memt_core server and proxy on 127.0.0.1.

The adapters are separate packages, but their tests run in the project's test command and reuse its
live-server helpers and their ``demo_proxy`` fixture (``tests/e2e/proxies.py``): the bundled demo
model, trained to answer from memory and to call ``get_weather`` (``MEMT_DEMO_MODEL=DIR`` points them
at another candidate checkpoint).
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests"))

from e2e.proxies import DEMO_MODEL as MODEL  # noqa: E402
from e2e.proxies import demo_proxy  # noqa: E402,F401  (pytest fixture: core + proxy on the demo model)

from memt_demo.tool_turns import TOOLS  # noqa: E402

WEATHER = TOOLS["get_weather"]  # the demo model's weather tool, exactly as it was trained


def run_example(name: str, proxy) -> str:
    """Run ``examples/<name>`` against the live proxy; returns its output (fails on a non-zero exit)."""
    import subprocess

    result = subprocess.run(
        [sys.executable, str(REPO / "examples" / name), "--base-url", proxy.base_url],
        capture_output=True, text=True, timeout=300, env={**os.environ, "PYTHONPATH": str(REPO)},
    )
    assert result.returncode == 0, result.stdout + result.stderr
    return result.stdout
