"""The demo evaluation shows a progress bar on a terminal once it takes a while, and nothing in logs."""

from __future__ import annotations

import subprocess
import sys

import pexpect

from e2e.servers import REPO_ROOT

EVAL = [str(REPO_ROOT / "scripts" / "eval_tiny.py"), "--split", "heldout", "--cases", "fact1=40", "--threads", "1"]


def test_evaluation_shows_progress_on_a_terminal():
    child = pexpect.spawn(sys.executable, EVAL, timeout=300, encoding="utf-8", cwd=str(REPO_ROOT))
    child.expect("evaluating")
    child.expect(pexpect.EOF)
    child.close()


def test_no_progress_bar_without_a_terminal():
    run = subprocess.run([sys.executable, *EVAL], capture_output=True, text=True, timeout=300, cwd=REPO_ROOT)
    assert "fact1" in run.stdout
    assert "evaluating" not in run.stderr + run.stdout
