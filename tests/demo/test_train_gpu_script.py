"""``scripts/train_gpu.sh``, the one command a GPU session runs for the demo model, works end to end.

It cannot train on a GPU here; its dry run (``DEVICE=cpu``) takes every step but the GPU tests and bench: it trains
the committed checkpoint two steps and leaves it, loadable, in one archive among at most 8 files.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tarfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_the_dry_run_leaves_a_loadable_checkpoint_in_out(tmp_path):
    from memt_core.checkpoint import read_checkpoint
    from memt_core.models import load_model

    out = tmp_path / "out"
    env = dict(os.environ, OUT=str(out), DEVICE="cpu", BUDGET="150", STEPS="2", BATCH="2", PYTHON=sys.executable)
    run = subprocess.run(["bash", str(ROOT / "scripts/train_gpu.sh")], env=env, capture_output=True, text=True,
                         timeout=300)
    assert run.returncode == 0, run.stderr
    files = sorted(p.name for p in out.iterdir())
    assert len(files) <= 8 and {"summary.txt", "env.txt", "train.log", "checkpoint.tar.gz"} <= set(files), files
    summary = (out / "summary.txt").read_text()
    assert "training: exit 0" in summary and "step 2/2" in summary, summary
    with tarfile.open(out / "checkpoint.tar.gz") as archive:
        archive.extractall(tmp_path, filter="data")
    training = json.loads((tmp_path / "checkpoint/training.json").read_text())
    assert training["config"]["batched"] and training["config"]["batch_size"] == 2
    assert "--init-from runs/demo-v3/m128-avg-316min" in training["command"]
    load_model(read_checkpoint(tmp_path / "checkpoint"))
