"""Joining, splitting and trimming the backbone's KV caches for continuous batching.

Rows of a decode batch keep their keys/values left-padded to a common length, with an attention mask
``[B, L]`` that is 0 on padding. Recurrent (linear-attention) layer states have no length axis and
are simply stacked. Only transformers' plain ``DynamicLayer`` and ``LinearAttentionLayer`` caches
are batched this way (Nano's layers); other cache kinds (DeepSeek-V4's compressed caches) decode
one row at a time — ``batchable`` says which.
"""

from __future__ import annotations

import copy

import torch
import torch.nn.functional as F
from transformers.cache_utils import DynamicLayer, LinearAttentionLayer

from memt_core.engine.fp8_kv import Fp8Layer
from memt_core.engine.paged_kv import PagedLayer

#: layers whose keys and values have a length axis to pad and cut (FP8 ones with one scale for all rows)
KV_LAYERS = (DynamicLayer, Fp8Layer)


def batchable(cache) -> bool:
    """True when every layer of ``cache`` is a kind this module can join and split."""
    return all(type(layer) in (*KV_LAYERS, PagedLayer, LinearAttentionLayer) for layer in cache.layers)


def _clone_layer(layer):
    clone = copy.copy(layer)
    if isinstance(layer, LinearAttentionLayer):
        clone.conv_states = dict(layer.conv_states)
        clone.recurrent_states = dict(layer.recurrent_states)
    return clone


def _new_cache(template, layers):
    cache = copy.copy(template)
    cache.layers = layers
    return cache


def _stacked(slots, key, parts: list[torch.Tensor]) -> torch.Tensor:
    """``parts`` stacked on the batch axis: in the recurrent slots' first rows (``memt_core.engine.state_slots``)
    where there are slots and they fit, else a new tensor."""
    if slots is not None:
        starts = [sum(p.shape[0] for p in parts[:i]) for i in range(len(parts))]
        placed = slots.place(key, list(zip(parts, starts)))
        if placed is not None:
            return placed
    return parts[0] if len(parts) == 1 else torch.cat(parts, dim=0)


def join(a, mask_a: torch.Tensor, b, mask_b: torch.Tensor, slots=None):
    """Stack two batched caches (rows of ``a`` first), left-padding the shorter to the longer; ``slots``: the
    recurrent slots the linear-attention states are stacked in (``memt_core.engine.state_slots.RecurrentSlots``)."""
    length = max(mask_a.shape[1], mask_b.shape[1])
    pad_a, pad_b = length - mask_a.shape[1], length - mask_b.shape[1]
    layers = []
    for number, (la, lb) in enumerate(zip(a.layers, b.layers)):
        layer = _clone_layer(la)
        if type(la) is PagedLayer:  # block tables move; the pool's tensors stay
            layer = la.joined(lb)
        elif type(la) in KV_LAYERS:
            if la.is_initialized and lb.is_initialized:
                layer.keys = torch.cat([F.pad(la.keys, (0, 0, pad_a, 0)), F.pad(lb.keys, (0, 0, pad_b, 0))], dim=0)
                layer.values = torch.cat([F.pad(la.values, (0, 0, pad_a, 0)), F.pad(lb.values, (0, 0, pad_b, 0))], dim=0)
        else:
            for index in la.recurrent_states:
                if la.conv_states[index] is not None:
                    layer.conv_states[index] = _stacked(slots, (number, f"conv{index}"), [la.conv_states[index], lb.conv_states[index]])
                if la.recurrent_states[index] is not None:
                    layer.recurrent_states[index] = _stacked(slots, (number, f"recurrent{index}"),
                                                             [la.recurrent_states[index], lb.recurrent_states[index]])
        layers.append(layer)
    mask = torch.cat([F.pad(mask_a, (pad_a, 0)), F.pad(mask_b, (pad_b, 0))], dim=0)
    return _new_cache(a, layers), mask


def select(cache, mask: torch.Tensor, rows: list[int], slots=None):
    """Keep ``rows`` of a batched cache, dropping leading columns that are padding for every kept row (the
    linear-attention states moved up in ``slots``, where given)."""
    index = torch.tensor(rows, device=mask.device)
    mask = mask.index_select(0, index)
    real = mask.any(dim=0).nonzero()
    start = int(real[0]) if real.numel() else mask.shape[1]
    mask = mask[:, start:]
    layers = []
    for number, layer in enumerate(cache.layers):
        clone = _clone_layer(layer)
        if type(layer) is PagedLayer:
            clone = layer.selected(rows, start)
        elif type(layer) in KV_LAYERS:
            if layer.is_initialized:
                clone.keys = layer.keys.index_select(0, index.to(layer.keys.device))[:, :, start:]
                clone.values = layer.values.index_select(0, index.to(layer.values.device))[:, :, start:]
        else:
            for i in layer.recurrent_states:
                for kind, states, kept in (("conv", layer.conv_states, clone.conv_states),
                                           ("recurrent", layer.recurrent_states, clone.recurrent_states)):
                    if states[i] is not None:
                        kept[i] = _stacked(slots, (number, f"{kind}{i}"), [states[i].index_select(0, index.to(states[i].device))])
        layers.append(clone)
    return _new_cache(cache, layers), mask


def held_tokens(cache) -> int:
    """Token slots a cache's full-attention keys take: rows × length of its first such layer (padding included); 0
    for a cache without one."""
    for layer in cache.layers:
        if type(layer) in KV_LAYERS and layer.is_initialized and layer.keys is not None:
            return int(layer.keys.shape[0] * layer.keys.shape[-2])
    return 0


def extract(cache, mask: torch.Tensor, row: int):
    """One row as an unpadded batch-of-one cache (for retaining a session's native context)."""
    single, single_mask = select(cache, mask, [row])
    return single
