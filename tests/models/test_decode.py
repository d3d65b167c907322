"""The fused decode step (``memt_core.models.decode``) against the reference (the model's own forward), on the CPU.

Both run the same decode steps from the same batched, left-padded caches with memory read by some rows and not
others; logits, key/value caches, convolution windows and recurrent states must agree to FP32 rounding, and greedy
tokens must be the same. The reference is transformers' modules as the engine runs them everywhere else.
"""

from __future__ import annotations

import asyncio
import copy

import pytest
import torch
from transformers import DynamicCache
from transformers.cache_utils import LinearAttentionLayer

from memt_core.engine import kv
from memt_core.memory.state import MemoryState
from memt_core.models.decode import FusedDecode
from memt_core.models.passes import memory_batch


@pytest.fixture(scope="module")
def demo_model():
    from memt_core.bundled import BUNDLED_MODEL
    from memt_core.models.weights import load_model

    return load_model(BUNDLED_MODEL)


def batch(model, lengths, seed=0):
    """Prefilled rows of ``lengths`` prompt tokens joined into one left-padded cache, as the engine batches them."""
    generator = torch.Generator().manual_seed(seed)
    device = next(model.parameters()).device
    cache = mask = None
    with torch.no_grad():
        for n in lengths:
            ids = torch.randint(3, model.config.vocab_size, (1, n), generator=generator).to(device)
            out = model(ids, past_key_values=DynamicCache(config=model.config), use_cache=True, logits_to_keep=1)
            own = torch.ones(1, n, dtype=torch.long, device=device)
            cache, mask = (out.past_key_values, own) if cache is None else kv.join(cache, mask, out.past_key_values, own)
    return cache, mask


def memories(model, rows, seed=1):
    """Every other row reads a random memory; the others none."""
    generator = torch.Generator().manual_seed(seed)
    shape = model.checkpoint.memory.state_shape()
    device = next(model.parameters()).device
    return [MemoryState({layer: (torch.randn(shape, generator=generator) * 0.5).to(device) for layer in model.memory_layers})
            if i % 2 == 0 else None for i in range(rows)]


def assert_close(actual, expected, relative=1e-5):
    """Equal to FP32 rounding: the largest difference a small part of the largest magnitude."""
    assert actual.shape == expected.shape
    difference = (actual - expected).abs().max().item()
    assert difference <= relative * expected.abs().max().item(), f"{difference:.3g} against magnitude {expected.abs().max().item():.3g}"


def assert_caches_close(reference, fused):
    for a, b in zip(reference.layers, fused.layers):
        if isinstance(a, LinearAttentionLayer):
            assert_close(b.conv_states[0], a.conv_states[0])
            assert_close(b.recurrent_states[0], a.recurrent_states[0], 1e-4)
        else:
            assert_close(b.keys, a.keys)
            assert_close(b.values, a.values)


@pytest.mark.parametrize("which", ["nano_model", "demo_model"])
def test_fused_steps_match_the_reference_over_a_generation(which, request):
    model = request.getfixturevalue(which)
    lengths = [5, 9, 2]
    cache, mask = batch(model, lengths)
    read = memory_batch(model, memories(model, len(lengths)))
    fused = FusedDecode(model)
    reference_cache, fused_cache = copy.deepcopy(cache), copy.deepcopy(cache)
    ids = torch.tensor([[7], [11], [13]])
    fed = list(lengths)
    with torch.no_grad():
        for _ in range(6):
            positions = torch.tensor([[n] for n in fed])
            mask = torch.cat([mask, torch.ones(len(fed), 1, dtype=torch.long)], dim=1)
            assert fused.can_run(ids, fused_cache)
            a = model(ids, memory=read, past_key_values=reference_cache, use_cache=True, attention_mask=mask,
                      position_ids=positions, logits_to_keep=1)
            b = fused(ids, memory=read, past_key_values=fused_cache, attention_mask=mask, position_ids=positions)
            assert b.past_key_values is fused_cache
            assert_close(b.logits, a.logits, 1e-4)
            assert_caches_close(reference_cache, fused_cache)
            ids = a.logits.argmax(-1)
            assert torch.equal(b.logits.argmax(-1), ids)
            fed = [n + 1 for n in fed]


def test_the_fused_weights_are_views_of_the_parameters_and_shared_between_steps(nano_model):
    first, second = FusedDecode(nano_model), FusedDecode(nano_model)
    assert first.layers is second.layers  # prepared once per model
    linear = nano_model.backbone.model.layers[0].linear_attn
    fused = first.layers[0].mixer.fused
    assert linear.in_proj_qkv.weight.data_ptr() == fused.data_ptr()  # a view: no second copy of the weights
    assert torch.equal(fused[: linear.in_proj_qkv.weight.shape[0]], linear.in_proj_qkv.weight)


def test_it_runs_only_where_it_can(nano_model, flash_model):
    fused = FusedDecode(nano_model)
    cache, _ = batch(nano_model, [3])
    assert fused.can_run(torch.tensor([[1]]), cache)
    assert not fused.can_run(torch.tensor([[1, 2]]), cache)  # one token a row
    assert not fused.can_run(torch.tensor([[1]]), DynamicCache(config=nano_model.config))  # nothing prefilled
    assert FusedDecode.supports(nano_model) and not FusedDecode.supports(flash_model)


def test_an_engine_decodes_the_same_tokens_with_and_without_it(demo_model):
    from memt_core.engine import TorchEngine
    from memt_core.protocol import effects as fx
    from memt_core.sampling import SamplingParams

    async def run(engine) -> list[list[int]]:
        await engine.apply(fx.NewMemory("s"))
        await engine.apply(fx.ForkCandidate("s", transaction="t"))
        await engine.commit("s", "t", "n", list(range(40, 90)))
        await engine.apply(fx.PublishCandidate("s", transaction="t"))
        greedy = SamplingParams(max_new_tokens=12, temperature=0, skip_eos=True)
        logprobs = SamplingParams(max_new_tokens=12, temperature=0, skip_eos=True, logprobs=True)
        seeded = SamplingParams(max_new_tokens=12, temperature=0.8, seed=3, skip_eos=True)

        async def ask(rid, prompt, params, session):
            return [e.token async for e in engine.query(rid, prompt, params, session=session) if e.token is not None]

        return list(await asyncio.gather(
            ask("a", [5, 6, 7], greedy, "s"), ask("b", [9, 10, 11, 12, 13], greedy, None),
            ask("c", [5, 6, 7], logprobs, "s"), ask("d", [21, 22], seeded, "s"),
        ))

    answers = []
    for fused in (False, True):
        engine = TorchEngine(demo_model, max_running_requests=8, fused_decode=fused).start()
        assert (engine.runner.fused is not None) == fused
        try:
            answers.append(asyncio.run(run(engine)))
        finally:
            engine.stop()
    assert answers[0] == answers[1]
    assert answers[1][0] == answers[1][2]  # asking for log-probabilities changes no token


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device (CI has none; run on a GPU host)")
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_on_cuda_the_fused_step_matches_the_reference_with_the_kernels_installed(nano_checkpoint, dtype):
    """On a GPU the fused step calls causal-conv1d's and flash-linear-attention's step kernels where installed, as
    transformers does in the reference: the two agree (BF16: to its rounding) and pick the same greedy tokens."""
    from memt_core.models.weights import load_model

    model = load_model(nano_checkpoint, device="cuda", dtype=dtype)
    fused = FusedDecode(model)
    cache, mask = batch(model, [5, 9, 2])
    read = memory_batch(model, memories(model, 3))
    reference_cache, fused_cache = copy.deepcopy(cache), copy.deepcopy(cache)
    ids = torch.tensor([[7], [11], [13]], device="cuda")
    fed = [5, 9, 2]
    tolerance = 1e-3 if dtype == torch.float32 else 5e-2
    with torch.no_grad():
        for _ in range(4):
            positions = torch.tensor([[n] for n in fed], device="cuda")
            mask = torch.cat([mask, torch.ones(3, 1, dtype=torch.long, device="cuda")], dim=1)
            a = model(ids, memory=read, past_key_values=reference_cache, use_cache=True, attention_mask=mask,
                      position_ids=positions, logits_to_keep=1)
            b = fused(ids, memory=read, past_key_values=fused_cache, attention_mask=mask, position_ids=positions)
            assert_close(b.logits.float(), a.logits.float(), tolerance)
            ids = a.logits.argmax(-1)
            fed = [n + 1 for n in fed]


def test_a_copied_model_gets_fused_weights_of_its_own(nano_model):
    first = FusedDecode(nano_model)
    copied = copy.deepcopy(nano_model)
    second = FusedDecode(copied)
    assert second.layers is not first.layers
    assert copied.backbone.model.layers[0].linear_attn.in_proj_qkv.weight.data_ptr() == second.layers[0].mixer.fused.data_ptr()
    assert FusedDecode(copied).layers is second.layers
