"""The FP8 KV cache (``--kv-cache-dtype fp8_e4m3``, ``memt_core.engine.fp8_kv``): full-attention keys and values
stored as float8_e4m3fn, read back within FP8's rounding; an engine on it batches as one at a time does, and stays
close to the compute dtype's cache (how close on the demo model: scripts/bench/kv_dtype.py)."""

from __future__ import annotations

import asyncio

import pytest
import torch
from transformers.cache_utils import DynamicLayer

from memt_core.engine import TorchEngine
from memt_core.engine.fp8_kv import FP8, Fp8Layer, new_cache
from memt_core.sampling import SamplingParams

pytestmark = pytest.mark.timeout(300)

PROMPTS = [[17, 42, 99], [5, 6, 7, 8, 9, 10, 11], [300, 12] * 6, list(range(100, 120))]


def greedy(n: int) -> SamplingParams:
    return SamplingParams(max_new_tokens=n, temperature=0, skip_eos=True)


def test_a_layer_stores_fp8_and_reads_back_within_its_rounding():
    layer = Fp8Layer()
    keys, values = torch.randn(1, 2, 5, 8), torch.randn(1, 2, 5, 8) * 3
    read_k, read_v = layer.update(keys, values)
    assert layer.keys.dtype == FP8 and layer.values.dtype == FP8 and read_k.dtype == torch.float32
    assert torch.allclose(read_k, keys, rtol=0.07, atol=0.02) and torch.allclose(read_v, values, rtol=0.07, atol=0.02)
    assert not torch.equal(read_k, keys)  # it was rounded
    more = torch.randn(1, 2, 1, 8)
    read_k, _ = layer.update(more, more)
    assert read_k.shape[-2] == 6 and layer.get_seq_length() == 6
    huge, _ = Fp8Layer().update(torch.full((1, 1, 1, 2), 1e4), torch.zeros(1, 1, 1, 2))
    assert huge.max() == 448  # beyond FP8's range: clipped


def test_only_plain_full_attention_layers_become_fp8(nano_model, flash_model):
    nano = new_cache(nano_model.config, "fp8_e4m3")
    assert any(type(layer) is Fp8Layer for layer in nano.layers)
    assert all(type(layer) is not DynamicLayer for layer in nano.layers)
    assert [type(a) for a in new_cache(nano_model.config).layers] == [type(b) for b in plain_layers(nano_model)]
    flash = new_cache(flash_model.config, "fp8_e4m3")  # DeepSeek-V4's own cache kinds stay as they are
    assert [type(layer) for layer in flash.layers] == [type(layer) for layer in new_cache(flash_model.config).layers]


def plain_layers(model):
    from transformers import DynamicCache

    return DynamicCache(config=model.config).layers


async def _answers(engine, prompts, n):
    async def one(i, prompt):
        return [e.token async for e in engine.query(f"q{i}", prompt, greedy(n)) if e.token is not None]

    return await asyncio.gather(*(one(i, p) for i, p in enumerate(prompts)))


def test_an_fp8_engine_batches_as_one_at_a_time_and_stays_close_to_the_compute_dtype(nano_model):
    fp8 = TorchEngine(nano_model, max_running_requests=8, kv_cache_dtype="fp8_e4m3").start()
    one = TorchEngine(nano_model, max_running_requests=1, kv_cache_dtype="fp8_e4m3").start()
    try:
        together = asyncio.run(_answers(fp8, PROMPTS, 12))
        alone = [asyncio.run(_answers(one, [p], 12))[0] for p in PROMPTS]
        assert together == alone  # the FP8 rows join, decode and leave the shared batch as plain ones do
        cache = fp8.runner.new_cache()
        out = nano_model(torch.tensor([PROMPTS[3]]), past_key_values=cache, use_cache=True)
        exact = nano_model(torch.tensor([PROMPTS[3]]), use_cache=True)
        assert any(getattr(layer, "keys", None) is not None and layer.keys.dtype == FP8 for layer in out.past_key_values.layers)
        step = nano_model(torch.tensor([[7]]), past_key_values=out.past_key_values, use_cache=True).logits[0, -1]
        reference = nano_model(torch.tensor([[7]]), past_key_values=exact.past_key_values, use_cache=True).logits[0, -1]
        error = (step - reference).abs().max() / reference.abs().max()
        assert 0 < error < 0.1, error  # rounded, not broken
    finally:
        fp8.stop()
        one.stop()


@pytest.mark.gpu
def test_fp8_kv_on_cuda(nano_checkpoint):
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA device")
    from memt_core.models.weights import load_model

    model = load_model(nano_checkpoint, device="cuda", dtype=torch.bfloat16)
    engine = TorchEngine(model, max_running_requests=4, kv_cache_dtype="fp8_e4m3").start()
    try:
        answers = asyncio.run(_answers(engine, PROMPTS, 8))
        assert all(len(a) == 8 for a in answers)
        cache = engine.runner.new_cache()
        out = model(torch.tensor([PROMPTS[0]], device="cuda"), past_key_values=cache, use_cache=True)
        assert any(getattr(layer, "keys", None) is not None and layer.keys.dtype == FP8 for layer in out.past_key_values.layers)
    finally:
        engine.stop()
