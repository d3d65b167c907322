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
    run_ranks_only(checkpoint, out, world, *extra)
    return torch.load(out)


def run_ranks_only(checkpoint: Path, out: Path, world: int = 2, *extra: str) -> None:
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


def test_dp_attention_ranks_running_their_own_work_equal_one_device(flash_checkpoint, flash_model, tmp_path):
    """Flash as the seed serves it (TP = EP = DP = 2, attention whole on each rank): each rank runs its own session's
    commit, query and greedy decode, of different lengths, meeting the other at the MLP blocks; each equals one device."""
    from rank_worker import WORK, run

    out = tmp_path / "dp.pt"
    run_ranks_only(flash_checkpoint, out, 2, "--dp-attention")
    rounds = []
    for rank, (turn, prompt, tokens) in enumerate(WORK):
        seen, alone = torch.load(f"{out}.rank{rank}"), run(flash_model, None, turn, prompt, tokens)
        assert seen["tokens"] == alone["tokens"]
        torch.testing.assert_close(seen["logits"], alone["logits"], rtol=1e-4, atol=1e-4)
        for layer, state in alone["memory"].items():  # whole on the rank: no gather
            torch.testing.assert_close(seen["memory"][layer], state, rtol=1e-4, atol=1e-4)
        rounds.append(seen["rounds"])
    # every rank joined every round: the longer work's rounds (rank 0's forward passes × MLP blocks)
    passes = 3 + WORK[0][2] - 1
    assert rounds == [passes * flash_model.config.num_hidden_layers] * 2


def test_ranks_waiting_for_rank_0s_next_call_outlive_the_bound_on_a_steps_collectives(nano_checkpoint, tmp_path):
    """A serving group idles between requests: the other ranks wait for rank 0's next call on a group of their own,
    without the bound (here 5 s) that a step's collectives keep; after 7 s of idling, a call and a collective still meet."""
    seen = run_ranks(nano_checkpoint, tmp_path / "idle.pt", 2, "--idle", "7", "--timeout", "5")
    assert seen == {"call": "step", "sum": 3.0}
