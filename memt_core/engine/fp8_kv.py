"""An FP8 KV cache (``--kv-cache-dtype fp8_e4m3``): full-attention layers keep their keys and values as
``float8_e4m3fn`` with a per-tensor scale, as SGLang stores them, and hand attention the dequantized tensors.

A stored value is ``round_fp8(x / scale)``; attention reads ``stored * scale`` in the compute dtype. The scale is one
number for every key (and one for every value) of the server, as SGLang's is without calibrated scales from the
checkpoint (``KV_SCALE`` = 1.0): one scale for all rows means batched caches join and split as plain ones do
(``memt_core.engine.kv``). Values beyond FP8's range (±448) are clipped. Half the bytes of BF16 per token, a quarter
of FP32; what it costs in agreement with the compute dtype's cache is measured by ``scripts/bench/kv_dtype.py``.

Linear-attention and latent-memory states, and DeepSeek-V4's compressed caches, stay in the compute dtype.
"""

from __future__ import annotations

import torch
from transformers.cache_utils import DynamicCache, DynamicLayer

FP8 = torch.float8_e4m3fn
FP8_MAX = 448.0
KV_SCALE = 1.0


class Fp8Layer(DynamicLayer):
    """A full-attention cache layer whose ``keys``/``values`` are FP8; ``update`` returns them dequantized."""

    scale = KV_SCALE

    def lazy_initialization(self, key_states: torch.Tensor, value_states: torch.Tensor) -> None:
        super().lazy_initialization(key_states, value_states)
        self.compute_dtype = key_states.dtype  # ``dtype`` stays the compute dtype: transformers reads it for masks
        self.keys = self.keys.to(FP8)
        self.values = self.values.to(FP8)

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs):
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        self.keys = torch.cat([self.keys, quantize(key_states, self.scale)], dim=-2)
        self.values = torch.cat([self.values, quantize(value_states, self.scale)], dim=-2)
        return dequantize(self.keys, self.scale, self.compute_dtype), dequantize(self.values, self.scale, self.compute_dtype)


def quantize(x: torch.Tensor, scale: float) -> torch.Tensor:
    return (x.float() / scale).clamp(-FP8_MAX, FP8_MAX).to(FP8)


def dequantize(x: torch.Tensor, scale: float, dtype: torch.dtype) -> torch.Tensor:
    return (x.float() * scale).to(dtype)


def new_cache(config, kv_cache_dtype: str = "auto") -> DynamicCache:
    """A fresh cache for ``config``'s layers: with ``fp8_e4m3``, its plain full-attention layers in FP8."""
    cache = DynamicCache(config=config)
    if kv_cache_dtype == "fp8_e4m3":
        cache.layers = [Fp8Layer() if type(layer) is DynamicLayer else layer for layer in cache.layers]
    return cache
