"""A model split over 2 CPU ranks (gloo) computes what one device does: the memory after a commit (each rank's heads),
the logits of a query reading it, and greedy tokens, for tensor parallelism, for experts split by EP, and with
``--deterministic-communication`` (sums in rank order).

Each rank is its own process (``rank_worker.py``), as in serving; the reference runs here on one device.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import torch

from memt_core.parallel.group import free_address

pytestmark = pytest.mark.timeout(300)

WORKER = Path(__file__).with_name("rank_worker.py")
sys.path.insert(0, str(WORKER.parent))
from rank_worker import TOKENS  # noqa: E402


def run_ranks(checkpoint: Path, out: Path, world: int = 2, *extra: str) -> dict:
    address = free_address()
    ranks = [subprocess.Popen([sys.executable, str(WORKER), str(rank), str(world), address, str(checkpoint), str(out), *extra],
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
             for rank in range(world)]
    outputs = []
    for rank in ranks:
        try:
            outputs.append(rank.communicate(timeout=240)[0])
        except subprocess.TimeoutExpired:
            for other in ranks:
                other.kill()
            raise
    assert all(rank.returncode == 0 for rank in ranks), "\n".join(outputs)[-4000:]
    return torch.load(out)


@pytest.fixture(scope="module")
def one_device(nano_model):
    from rank_worker import run

    return run(nano_model)


@pytest.mark.parametrize("extra", [(), ("--ep", "2"), ("--deterministic",)], ids=["tp2", "tp2-ep2", "tp2-deterministic"])
def test_two_ranks_equal_one_device(nano_checkpoint, nano_model, one_device, tmp_path, extra):
    seen = run_ranks(nano_checkpoint, tmp_path / "rank0.pt", 2, *extra)
    assert seen["tokens"] == one_device["tokens"]
    torch.testing.assert_close(seen["logits"], one_device["logits"], rtol=1e-4, atol=1e-4)
    assert set(seen["memory"]) == set(one_device["memory"])
    for layer, state in one_device["memory"].items():
        torch.testing.assert_close(seen["memory"][layer], state, rtol=1e-4, atol=1e-4)  # fp32: sums in another order
    # per forward pass one all-reduce per block (attention with the memory read folded in, the linear attention, the
    # MLP) and the logits' gather; 10 passes (commit, query, prefill, 7 decode steps); one gather per memory layer
    layers = nano_model.config.num_hidden_layers
    passes = 3 + TOKENS - 1
    assert seen["traffic"]["collectives"] == passes * (2 * layers + 1) + len(nano_model.memory_layers)
