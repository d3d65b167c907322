"""Live fixtures and helpers for the adapter packages' tests: the real memt_core server and proxy on 127.0.0.1.

The adapters are separate packages, but their tests run in the project's test command and reuse its
live-server helpers (``tests/e2e/servers.py``, ``tests/e2e/proxies.py``). They drive the bundled demo
model, which is trained to answer from memory and to call ``get_weather``; ``MEMT_DEMO_MODEL=DIR``
points them at another candidate checkpoint.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests"))

from e2e.proxies import ProxyServer  # noqa: E402
from e2e.servers import MemTServer  # noqa: E402

from memt_core.launch import BUNDLED_MODEL  # noqa: E402

DEMO_PATH = Path(os.environ.get("MEMT_DEMO_MODEL") or BUNDLED_MODEL)
MODEL = "memt-tiny-demo"
WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Get the current weather in a city.",
        "parameters": {"type": "object", "properties": {"city": {"type": "string", "description": "The city name."}}, "required": ["city"]},
    },
}


@pytest.fixture(scope="session")
def demo_proxy(tmp_path_factory):
    """(proxy, upstream) serving the bundled demo model; fails (never skips) when the model is missing."""
    if not (DEMO_PATH / "config.json").is_file():
        pytest.fail(f"the bundled demo model is missing at {DEMO_PATH} (train it with scripts/train_tiny.py)", pytrace=False)
    upstream = MemTServer(DEMO_PATH, state_directory=tmp_path_factory.mktemp("adapter-state")).start()
    proxy = ProxyServer(upstream.url, DEMO_PATH, args=["--served-model-name", MODEL]).start()
    try:
        yield proxy, upstream
    finally:
        proxy.stop()
        upstream.close()


def run_example(name: str, proxy) -> str:
    """Run ``examples/<name>`` against the live proxy; returns its output (fails on a non-zero exit)."""
    import subprocess

    result = subprocess.run(
        [sys.executable, str(REPO / "examples" / name), "--base-url", proxy.base_url],
        capture_output=True, text=True, timeout=300, env={**os.environ, "PYTHONPATH": str(REPO)},
    )
    assert result.returncode == 0, result.stdout + result.stderr
    return result.stdout
