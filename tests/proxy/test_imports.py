"""The proxy installs without PyTorch (the ``proxy`` extra): importing it must not pull torch in."""

from __future__ import annotations

import subprocess
import sys


def test_the_proxy_imports_without_torch():
    code = "import sys, memt_proxy.__main__, memt_proxy.app, memt_proxy.responses; print('torch' in sys.modules)"
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr[-2000:]
    assert run.stdout.strip() == "False"
