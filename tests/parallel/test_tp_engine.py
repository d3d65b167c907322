"""The torch engine on 2 CPU ranks (rank 1 a process of its own, gloo) answers as on one device: concurrent greedy
queries batched together and decoded by the fused step (its residuals added after the all-reduce; with the experts
split by EP, by the model's modules), with and without memory, after a commit; its snapshots import at TP 1 (and TP 1's at TP
2) with the same identity and the same answers; stopping it ends every rank."""

from __future__ import annotations

import asyncio
import dataclasses
import shutil

import pytest

from memt_core.checkpoint import read_checkpoint
from memt_core.engine import EngineOptions, TorchEngine
from memt_core.engine.budget import Budget
from memt_core.memory.snapshot import load_snapshot
from memt_core.parallel.plan import Parallel
from memt_core.protocol import effects as fx
from memt_core.sampling import SamplingParams

pytestmark = pytest.mark.timeout(300)

TURN = list(range(20, 60))
PROMPTS = [[17, 42, 99, 123], [5, 6, 7, 8, 9, 10, 11], [300, 12] * 6]


def greedy(n: int) -> SamplingParams:
    return SamplingParams(max_new_tokens=n, temperature=0, skip_eos=True)


async def answers(engine) -> tuple[list, str]:
    await engine.apply(fx.NewMemory("s"))
    await engine.apply(fx.ForkCandidate("s", transaction="t"))
    await engine.commit("s", "t", "n", TURN)
    await engine.apply(fx.PublishCandidate("s", transaction="t"))

    async def ask(rid, prompt, session):
        return [e.token async for e in engine.query(rid, prompt, greedy(10), session=session) if e.token is not None]

    together = await asyncio.gather(*(ask(f"q{i}", p, "s") for i, p in enumerate(PROMPTS)), ask("plain", PROMPTS[0], None))
    snapshot = await engine.apply(fx.ExportSnapshot("s", transaction=None, file=None, overwrite=False))
    return list(together), snapshot


async def imported(engine, file: str) -> list[int]:
    await engine.apply(fx.NewMemory("i"))
    await engine.apply(fx.ForkCandidate("i", transaction="t"))
    await engine.apply(fx.ImportSnapshot("i", transaction="t", file=file))
    await engine.apply(fx.PublishCandidate("i", transaction="t"))
    return [e.token async for e in engine.query("after-import", PROMPTS[0], greedy(10), session="i") if e.token is not None]


SPLITS = {
    # with a budget, as start_memt_nano.sh serves: every rank's KV in its paged pool, its memory heads in slots
    "tp2": ("nano_checkpoint", Parallel(tp=2), Budget(max_total_tokens=1024)),
    "tp2-ep2": ("nano_checkpoint", Parallel(tp=2, ep=2), Budget()),
    # Flash as the seed serves it: each rank its own sessions' attention and memory, whole; the experts split
    "flash-dp-attention": ("flash_checkpoint", Parallel(tp=2, ep=2, dp=2, dp_attention=True), Budget()),
}


@pytest.mark.parametrize("split", list(SPLITS))
def test_two_ranks_answer_as_one_device_and_snapshots_move_between_them(request, tmp_path, split):
    fixture, parallel, budget = SPLITS[split]
    checkpoint = read_checkpoint(request.getfixturevalue(fixture))
    one_dir, two_dir = tmp_path / "tp1", tmp_path / "tp2"
    base = EngineOptions(device="cpu", max_running_requests=8, max_commit_batch=2, threads=1)
    one = TorchEngine.load(checkpoint, dataclasses.replace(base, state_directory=str(one_dir))).start()
    two = TorchEngine.load(checkpoint, dataclasses.replace(base, state_directory=str(two_dir), parallel=parallel, budget=budget)).start()
    processes = list(two.runner.processes)
    try:
        assert two.runner.group.world == 2 and len(processes) == 1 and processes[0].poll() is None
        budgeted = budget.max_total_tokens is not None
        assert (two.runner.pool is not None, two.runner.slots is not None) == (budgeted, budgeted)
        if parallel.ep == 1:  # the fused step, its residuals added after the all-reduce
            assert two.runner.fused is not None and two.runner.fused.reduce is not None
        else:  # experts split by EP: the model's own modules decode
            assert two.runner.fused is None
        expected, one_file = asyncio.run(answers(one))
        seen, two_file = asyncio.run(answers(two))
        assert seen == expected
        identity = checkpoint.identity()
        layers, shape = checkpoint.memory.memory_layers, checkpoint.memory.state_shape()
        exported = load_snapshot(two_dir / two_file, identity=identity, layers=layers, shape=shape)  # every head, TP 1's identity
        reference = load_snapshot(one_dir / one_file, identity=identity, layers=layers, shape=shape)
        for layer in layers:
            assert (exported.get(layer) - reference.get(layer)).abs().max() < 1e-4
        shutil.copy(two_dir / two_file, one_dir / "from-tp2.safetensors")
        shutil.copy(one_dir / one_file, two_dir / "from-tp1.safetensors")
        assert asyncio.run(imported(one, "from-tp2.safetensors")) == expected[0]
        assert asyncio.run(imported(two, "from-tp1.safetensors")) == expected[0]
        assert two.stats.decode_steps > 0 and two.alive
        if parallel.dp_attention:  # the plain query ran beside the session's, on the other rank
            assert two.runner.exchange.rounds > 0 and all(two.runner.owners.prefills)
    finally:
        one.stop()
        two.stop()
    assert all(process.poll() is not None for process in processes), "stopping the engine ends every rank"
