"""The paged KV pool (``--kv-pool paged``, ``memt_core.engine.paged_kv``): keys and values in blocks of one pool
allocated at start, a block table per request. An engine on it answers exactly as on transformers' growing cache,
batched and alone; rows joining and leaving a batch move tables, not tensors; blocks come back when a request ends;
an exhausted pool fails one request, never the engine."""

from __future__ import annotations

import asyncio
import gc
import time

import pytest
import torch

from memt_core.engine import TorchEngine
from memt_core.engine.paged_kv import BLOCK, KVPool, LayerPool, PagedLayer, PoolExhausted, Table
from memt_core.sampling import SamplingParams

pytestmark = pytest.mark.timeout(300)

PROMPTS = [[17, 42, 99], [5, 6, 7, 8, 9, 10, 11], [300, 12] * 6, list(range(100, 140))]


def greedy(n: int) -> SamplingParams:
    return SamplingParams(max_new_tokens=n, temperature=0, skip_eos=True)


async def _answers(engine, prompts, n):
    async def one(i, prompt):
        return [e.token async for e in engine.query(f"q{i}", prompt, greedy(n)) if e.token is not None]

    return await asyncio.gather(*(one(i, p) for i, p in enumerate(prompts)))


def blocks_back(engine, timeout: float = 30.0) -> bool:
    """Whether the pool's blocks are all free within ``timeout``: a finished row leaves the batch at the worker's
    next step, just after its last event reached the client."""
    deadline = time.monotonic() + timeout
    while True:
        gc.collect()
        if engine.capabilities()["memory_budget"]["kv_pool"]["blocks_used"] == 0:
            return True
        if time.monotonic() > deadline:
            return False
        time.sleep(0.01)


def test_a_table_writes_and_reads_its_rows_through_blocks_and_gives_them_back():
    pool = LayerPool(4, heads=2, dim=3, dtype=torch.float32, device="cpu")
    table = Table(pool)
    keys = torch.randn(2, BLOCK + 5, 3)
    table.append(keys, -keys)
    assert table.length == BLOCK + 5 and pool.used == 2
    layer = PagedLayer(pool, [table], width=BLOCK + 7)  # two columns of left padding
    got_k, got_v = layer.gather()
    assert torch.equal(got_k[0, :, 2:], keys) and torch.equal(got_v[0, :, 2:], -keys) and not got_k[0, :, :2].any()
    del table, layer
    gc.collect()
    assert pool.used == 0
    grab = [Table(pool) for _ in range(4)]
    for t in grab:
        t.append(torch.zeros(2, 1, 3), torch.zeros(2, 1, 3))
    with pytest.raises(PoolExhausted):
        Table(pool).append(torch.zeros(2, 1, 3), torch.zeros(2, 1, 3))


def test_the_pool_takes_the_full_attention_layers_only(nano_model):
    pool = KVPool(nano_model.config, 100, rows=4, dtype=torch.float32, device="cpu")
    cache = pool.new_cache()
    assert pool.blocks == -(-100 // BLOCK) + 4
    assert sum(type(layer) is PagedLayer for layer in cache.layers) == len(pool.layers) > 0
    assert pool.describe()["bytes"] > 0


def test_a_paged_engine_answers_as_the_growing_cache_does_and_returns_its_blocks(nano_model):
    paged = TorchEngine(nano_model, max_running_requests=8, max_total_tokens=400, kv_pool_tokens=400).start()
    plain = TorchEngine(nano_model, max_running_requests=8).start()
    try:
        expected = asyncio.run(_answers(plain, PROMPTS, 12))
        assert asyncio.run(_answers(paged, PROMPTS, 12)) == expected  # batched: rows join and leave the shared batch
        assert [asyncio.run(_answers(paged, [p], 12))[0] for p in PROMPTS] == expected  # alone
        assert blocks_back(paged)  # every request gave its blocks back
    finally:
        paged.stop()
        plain.stop()


def test_the_fused_decode_step_advances_a_paged_cache_as_the_growing_one(nano_model):
    """The fused decode step (``memt_core.models.decode``) reads a full-attention layer through ``update`` alone, so
    it runs on the pool's layers too, with the growing cache's logits."""
    from memt_core.engine.runner import ModelRunner

    paged = ModelRunner(nano_model, kv_pool_tokens=256, max_rows=2)
    plain = ModelRunner(nano_model, max_rows=2)
    assert paged.fused is not None
    ids, step = torch.tensor([PROMPTS[1]]), torch.tensor([[5]])
    logits = []
    for runner in (paged, plain):
        with torch.no_grad():
            cache = runner.forward_prompt(ids, None, runner.new_cache()).past_key_values
            assert runner.fused.can_run(step, cache)
            mask = torch.ones(1, ids.shape[1] + 1, dtype=torch.long)
            out = runner.fused(step, memory=None, past_key_values=cache, attention_mask=mask, position_ids=torch.tensor([[ids.shape[1]]]))
        logits.append(out.logits)
    torch.testing.assert_close(logits[0], logits[1])


def test_an_exhausted_pool_fails_one_request_and_the_engine_goes_on(nano_model):
    engine = TorchEngine(nano_model, max_running_requests=2, kv_pool_tokens=BLOCK).start()  # 1 + 2 * 2 + 64 blocks
    try:
        async def scenario():
            events = engine.query("long", [10 + i % 400 for i in range(BLOCK * 80)], greedy(2))
            failed = [e async for e in events]
            assert failed[-1].error is not None and "KV pool" in str(failed[-1].error)
            return await _answers(engine, [PROMPTS[0]], 4)

        [after] = asyncio.run(scenario())
        assert len(after) == 4 and engine.alive
    finally:
        engine.stop()
