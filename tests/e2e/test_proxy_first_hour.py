"""A new user's first hour with the proxy (issue 58): a busy port, a stop in the README's order, a core stopped first.

Each test starts the real ``python -m memt_proxy`` (and, where it needs one, a real core) on 127.0.0.1.
"""

from __future__ import annotations

import socket
import subprocess
import sys

import pytest

from e2e.servers import HOST, REPO_ROOT


@pytest.mark.parametrize("embedded", [False, True], ids=["two-processes", "embedded"])
def test_a_taken_port_is_refused_in_one_line_before_anything_else(nano_checkpoint, embedded):
    with socket.socket() as taken:
        taken.bind((HOST, 0))
        taken.listen()
        port = taken.getsockname()[1]
        mode = ["--embedded", "--core-args", "--device cpu"] if embedded else ["--upstream", "http://127.0.0.1:9"]
        run = subprocess.run(
            [sys.executable, "-m", "memt_proxy", "--model-path", str(nano_checkpoint), "--host", HOST, "--port", str(port), *mode],
            capture_output=True, text=True, timeout=120, cwd=REPO_ROOT,
        )
    assert run.returncode == 2, run.stderr[-2000:]
    lines = [line for line in (run.stdout + run.stderr).splitlines() if line.strip()]
    assert lines == [f"memt_proxy: refused: cannot listen on {HOST}:{port}: Address already in use"], lines
