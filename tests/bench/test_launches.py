"""The launch count of ``scripts/bench/launches.py``: what it counts as a kernel, and the decode step's count."""

from __future__ import annotations

import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "scripts"))


def test_views_are_free_compositions_count_as_what_they_call_and_item_is_a_sync():
    from bench.launches import count_ops

    x, w, ones = torch.randn(4, 8), torch.randn(16, 8), torch.ones(8)
    assert count_ops(lambda: x.view(2, 16).transpose(0, 1)[1:].unsqueeze(0)).launches == 0
    assert count_ops(lambda: torch.nn.functional.linear(x, w)).launches == 1  # linear → t (a view) + mm
    assert count_ops(lambda: x * 2 + 1).launches == 2
    summed = count_ops(lambda: int(x.sum()))
    assert (summed.launches, summed.host_syncs) == (1, 1)
    assert count_ops(lambda: torch.nn.functional.rms_norm(x, (8,), ones)).launches == 1  # one fused kernel on a GPU
    assert dict(count_ops(lambda: torch.softmax(x, -1).sum()).by_name) == {"aten::_softmax": 1, "aten::sum": 1}


def test_a_decode_step_of_the_tiny_nano_model_is_counted_the_same_every_step(nano_model):
    from bench.launches import measure

    counts = measure(nano_model, 2, steps=2, warmup=1)
    assert counts[0].launches == counts[1].launches > 0
    assert counts[0].operators >= counts[0].launches


def test_the_gpu_run_is_one_valid_script():
    """scripts/bench/gpu.sh is what a GPU session runs, once: it must at least parse (it cannot run here)."""
    import subprocess

    script = Path(__file__).resolve().parents[2] / "scripts/bench/gpu.sh"
    assert subprocess.run(["bash", "-n", str(script)], capture_output=True).returncode == 0
    text = script.read_text()
    for needed in ("make_tiny_checkpoint.py", "--widths nano --layers 4 --experts 32", "pytest -m gpu", "engine.py",
                   "lengths.py", "launches.py", '"$OUT'):
        assert needed in text, needed
