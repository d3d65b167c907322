"""Issue 56's checks on one GPU (skipped without one; ``scripts/bench/gpu.sh`` runs every gpu-marked test): NCCL
meets with a world of one, and ``--tp-size 2`` with one visible GPU is refused before anything loads."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import torch

pytestmark = [pytest.mark.gpu, pytest.mark.timeout(200)]


def needs_cuda():
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA device")


def test_nccl_meets_with_a_world_of_one():
    needs_cuda()
    from memt_core.parallel.group import RankGroup, free_address

    with RankGroup.joined(0, 1, backend="nccl", address=free_address()) as group:
        import torch.distributed as dist

        value = torch.ones(4, device="cuda")
        dist.all_reduce(value)  # a real NCCL collective, not RankGroup's one-rank shortcut
        assert value.tolist() == [1.0] * 4 and dist.get_backend() == "nccl" and group.world == 1


def test_two_ranks_on_one_visible_gpu_are_refused(nano_checkpoint):
    needs_cuda()
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": "0"}
    done = subprocess.run([sys.executable, "-m", "memt_core.launch", "--model-path", str(nano_checkpoint), "--device", "cuda",
                           "--tp-size", "2", "--dry-run"], capture_output=True, text=True, env=env, timeout=120)
    assert done.returncode != 0 and "--tp-size 2 needs 2 GPUs" in done.stderr and "Traceback" not in done.stderr
