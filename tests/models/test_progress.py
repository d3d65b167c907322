"""Loading a model shows a progress bar on a terminal, and nothing when output is not a terminal."""

from __future__ import annotations

import subprocess
import sys

import pexpect

LOAD = "import sys; from memt_core.checkpoint import read_checkpoint; from memt_core.models.weights import load_model; load_model(read_checkpoint(sys.argv[1])); print('loaded')"


def test_model_loading_shows_progress_on_a_terminal(nano_checkpoint):
    child = pexpect.spawn(sys.executable, ["-c", LOAD, str(nano_checkpoint)], timeout=120, encoding="utf-8")
    child.expect("loading weights")
    child.expect("loaded")
    child.close()


def test_no_progress_bar_without_a_terminal(nano_checkpoint):
    run = subprocess.run([sys.executable, "-c", LOAD, str(nano_checkpoint)], capture_output=True, text=True, timeout=120)
    assert run.returncode == 0 and run.stdout.strip() == "loaded"
    assert "loading weights" not in run.stderr
