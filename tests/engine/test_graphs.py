"""CUDA-graph decode (``memt_core.engine.graphs``): its static buffers on the CPU, its replayed graphs on a GPU.

On the CPU ``GraphDecode(capture=False)`` runs the fused step over the same static buffers a graph replays (the
batch copied in, the new column written in place, context and row buckets, padding rows, views handed back to
the engine): its tokens must be the eager step's. With CUDA, an engine with ``cuda_graphs=True`` must give the
same tokens as the eager engine.
"""

from __future__ import annotations

import asyncio
import copy

import pytest
import torch
from transformers import DynamicCache

from memt_core.engine import kv
from memt_core.engine.graphs import GraphDecode, buckets
from memt_core.models.decode import FusedDecode
from memt_core.models.passes import memory_batch

needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device (CI has none; run on a GPU host)")


@pytest.fixture(scope="module")
def demo_model():
    from memt_core.bundled import BUNDLED_MODEL
    from memt_core.models.weights import load_model

    return load_model(BUNDLED_MODEL)


def test_buckets_double_up_to_the_largest():
    assert buckets(1) == [1] and buckets(32) == [1, 2, 4, 8, 16, 32] and buckets(24) == [1, 2, 4, 8, 16, 24]
    assert buckets(4096, 128) == [128, 256, 512, 1024, 2048, 4096] and buckets(100, 128) == [100]


def prefilled(model, lengths, seed=0):
    generator = torch.Generator().manual_seed(seed)
    cache = mask = None
    with torch.no_grad():
        for n in lengths:
            ids = torch.randint(3, model.config.vocab_size, (1, n), generator=generator)
            out = model(ids, past_key_values=DynamicCache(config=model.config), use_cache=True, logits_to_keep=1)
            own = torch.ones(1, n, dtype=torch.long)
            cache, mask = (out.past_key_values, own) if cache is None else kv.join(cache, mask, out.past_key_values, own)
    return cache, mask


@pytest.mark.parametrize("which", ["nano_model", "demo_model"])
def test_static_buffers_decode_what_the_eager_step_decodes(which, request):
    """Across a context bucket (124 + 1 → 128 → 256 columns), a row leaving the batch (a reload into the buffers)
    and memory read by some rows: the same tokens, logits equal to rounding."""
    model = request.getfixturevalue(which)
    fused = FusedDecode(model)
    graphs = GraphDecode(fused, max_rows=4, max_tokens=512, capture=False)
    lengths = [120, 7, 60]
    cache, mask = prefilled(model, lengths)
    shape = model.checkpoint.memory.state_shape()
    from memt_core.memory.state import MemoryState

    states = [MemoryState({layer: torch.randn(shape) * 0.5 for layer in model.memory_layers}), None, None]
    read = memory_batch(model, states)
    eager_cache, eager_mask = copy.deepcopy(cache), mask.clone()
    static_cache, static_mask = cache, mask
    ids = torch.tensor([[5], [6], [7]])
    fed = list(lengths)
    rows = [0, 1, 2]
    for step in range(10):
        if step == 6:  # the middle row finishes: the engine selects the others, the buffers are loaded anew
            rows, keep = [0, 2], [0, 2]
            eager_cache, eager_mask = kv.select(eager_cache, eager_mask, keep)
            static_cache, static_mask = kv.select(static_cache, static_mask, keep)
            ids, fed = ids[keep], [fed[i] for i in keep]
            read = memory_batch(model, [states[i] for i in keep])
        positions = torch.tensor([[n] for n in fed])
        eager_mask = torch.cat([eager_mask, torch.ones(len(rows), 1, dtype=torch.long)], dim=1)
        static_mask = torch.cat([static_mask, torch.ones(len(rows), 1, dtype=torch.long)], dim=1)
        a = fused(ids, memory=read, past_key_values=eager_cache, attention_mask=eager_mask, position_ids=positions)
        b = graphs.step(ids, positions, static_mask, read, static_cache)
        assert b is not None
        eager_cache, static_cache = a.past_key_values, b.past_key_values
        scale = a.logits.abs().max().item()
        assert (a.logits - b.logits).abs().max().item() <= 1e-4 * scale
        assert torch.equal(a.logits.argmax(-1), b.logits.argmax(-1))
        ids = a.logits.argmax(-1)
        fed = [n + 1 for n in fed]
    assert graphs.stats["loads"] == 2  # the first step and the step after the row left
    # the handed cache is the batch as the engine sees it: the same keys as the eager cache, the same length
    for x, y in zip(eager_cache.layers, static_cache.layers):
        if hasattr(x, "keys") and not hasattr(x, "conv_states"):
            assert x.keys.shape == y.keys.shape
            assert (x.keys - y.keys).abs().max() <= 1e-4 * x.keys.abs().max()


def test_a_batch_beyond_the_buffers_is_left_to_the_eager_step(nano_model):
    graphs = GraphDecode(FusedDecode(nano_model), max_rows=2, max_tokens=128, capture=False)
    cache, mask = prefilled(nano_model, [4, 4, 4])
    mask = torch.cat([mask, torch.ones(3, 1, dtype=torch.long)], dim=1)
    assert graphs.step(torch.tensor([[1], [2], [3]]), torch.tensor([[4], [4], [4]]), mask, None, cache) is None  # 3 rows > 2
    cache, mask = prefilled(nano_model, [130])
    mask = torch.cat([mask, torch.ones(1, 1, dtype=torch.long)], dim=1)
    assert graphs.step(torch.tensor([[1]]), torch.tensor([[130]]), mask, None, cache) is None  # 131 tokens > 128


async def _conversation(engine) -> list[list[int]]:
    from memt_core.protocol import effects as fx
    from memt_core.sampling import SamplingParams

    await engine.apply(fx.NewMemory("s"))
    await engine.apply(fx.ForkCandidate("s", transaction="t"))
    await engine.commit("s", "t", "n", list(range(40, 140)))
    await engine.apply(fx.PublishCandidate("s", transaction="t"))

    async def ask(rid, prompt, tokens, session):
        params = SamplingParams(max_new_tokens=tokens, temperature=0, skip_eos=True)
        return [e.token async for e in engine.query(rid, prompt, params, session=session) if e.token is not None]

    first = await asyncio.gather(ask("a", list(range(3, 20)), 20, "s"), ask("b", [9, 10, 11], 6, None),
                                 ask("c", list(range(50, 170)), 14, "s"))  # rows leave at different steps
    second = await asyncio.gather(ask("d", [21, 22], 9, None), ask("e", list(range(3, 20)), 20, "s"))
    return [*first, *second]


@pytest.mark.parametrize("max_tokens", [256, 128])
def test_an_engine_over_static_buffers_decodes_the_eager_engines_tokens(demo_model, max_tokens):
    """With 128 tokens of buffers the longest row outgrows them mid-answer: eager steps from there, then the
    buffers again once it has left the batch."""
    from memt_core.engine import TorchEngine

    answers = []
    for static in (False, True):
        engine = TorchEngine(demo_model, max_running_requests=4)
        if static:
            engine.runner.graphs = GraphDecode(engine.runner.fused, max_rows=4, max_tokens=max_tokens, capture=False)
        engine.start()
        try:
            answers.append(asyncio.run(_conversation(engine)))
        finally:
            engine.stop()
        if static:
            stats = engine.runner.graphs.stats
            assert stats["uncaptured"] > 0 and stats["loads"] >= 3
            assert (stats["eager"] > 0) == (max_tokens == 128)  # the 120-token prompt's answer outgrows 128
    assert answers[0] == answers[1]


@pytest.mark.gpu
@needs_cuda
def test_cuda_graph_decode_gives_the_eager_engines_tokens():
    """The opt-in CUDA-graph decode (--enable-cuda-graph) against eager steps on the GPU: the same tokens."""
    from memt_core.bundled import BUNDLED_MODEL
    from memt_core.engine import TorchEngine
    from memt_core.models.weights import load_model

    model = load_model(BUNDLED_MODEL, device="cuda")
    answers, graphs = [], None
    for cuda_graphs in (False, True):
        engine = TorchEngine(model, max_running_requests=4, cuda_graphs=cuda_graphs, cuda_graph_max_tokens=512).start()
        try:
            answers.append(asyncio.run(_conversation(engine)))
        finally:
            engine.stop()
        graphs = engine.runner.graphs
    assert graphs is not None and graphs.stats["replays"] > 0 and len(graphs.graphs) == 3 * 3  # rows 1, 2, 4 × 128-512
    assert answers[0] == answers[1]
