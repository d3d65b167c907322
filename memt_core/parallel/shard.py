"""One rank's share of a MemT model: built at its shard's sizes, loaded from its slices, joined by all-reduces.

A rank's model is the same transformers backbone and memory modules, built from a configuration whose head counts
and intermediate sizes are the rank's share (``RankCheckpoint``): attention, linear-attention and latent-memory heads
divided by attention TP (KV heads replicated when fewer than the ranks), experts' and shared experts' intermediate
sizes by TP / EP and TP. Each parameter is then read from its slice of the safetensors files
(``safe_open(...).get_slice``; never the whole tensor, then a cut), by its family's rules (``Family.tensor_split``, a
hook beside ``decode_step`` and ``kernels``: for Nano and Flash ``memt_core.parallel.plan.split_of``), with
the layouts that are not one contiguous block: the linear attention's ``in_proj_qkv`` and conv1d (q, k and v blocks,
each sliced), the experts' ``gate_up_proj`` (gate and up halves, each sliced).

Every row-parallel product leaves a partial sum on each rank; one all-reduce per block joins them, as a forward hook
on the block's attention, linear attention and MLP. In a memory layer the memory read (its ``o_proj`` row-parallel
too) is added to attention's partial output before that all-reduce: one collective for both. ``lm_head`` is
vocabulary-parallel, its logits gathered on every rank. The embedding stays whole on every rank (a token reads one
row of it). A commit writes each rank's memory heads in place: no communication.

Where this departs from transformers' own ``base_model_tp_plan`` (``from_pretrained(..., tp_plan="auto")``): that
loads through DTensor on a device mesh, and its gated-delta projections are ``colwise_gather_output`` (every rank keeps
every head's recurrent state); here, as in SGLang, the heads are split and each rank keeps its own heads' states. So
are the memory heads, whose states are the sessions' memory, which transformers knows nothing of. Building the
modules at the shard's sizes also means a rank never allocates, nor reads, more than its share.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import torch
from safetensors import safe_open
from torch import nn

from memt_core.checkpoint import Checkpoint
from memt_core.errors import CheckpointError
from memt_core.parallel.group import RankGroup
from memt_core.parallel.plan import DENSE, EXPERTS, KV, KV_HEADS, VOCAB, Parallel, split_of


class RankCheckpoint:
    """A checkpoint as one rank sees it: its backbone configuration and memory at the rank's sizes; everything else,
    the identity of its snapshots included, the whole checkpoint's."""

    def __init__(self, whole: Checkpoint, parallel: Parallel):
        self.whole, self.parallel = whole, parallel
        self.backbone = rank_backbone(whole.backbone, parallel)
        memory = whole.memory
        self.memory = dataclasses.replace(memory, num_heads=memory.num_heads // parallel.attention_tp)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.whole, name)


def rank_backbone(backbone: dict, p: Parallel) -> dict:
    """The backbone configuration at one rank's sizes."""
    shard = dict(backbone)
    a = p.attention_tp
    for key in ("num_attention_heads", "linear_num_key_heads", "linear_num_value_heads"):
        if shard.get(key):
            shard[key] = int(shard[key]) // a
    if shard.get(KV_HEADS):
        shard[KV_HEADS] = max(int(shard[KV_HEADS]) // a, 1)
    if shard.get("moe_intermediate_size"):
        shard["moe_intermediate_size"] = int(shard["moe_intermediate_size"]) // p.expert_tp
    for key in ("shared_expert_intermediate_size", "intermediate_size"):
        if shard.get(key):
            shard[key] = int(shard[key]) // p.tp
    return shard


class VocabParallelHead(nn.Module):
    """``lm_head`` split by vocabulary rows; its logits gathered along the vocabulary on every rank."""

    def __init__(self, hidden: int, rows: int, group: RankGroup):
        super().__init__()
        self.weight = nn.Parameter(torch.empty(rows, hidden))
        self.group = group

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.group.gather_last(nn.functional.linear(x, self.weight))


def build_rank_model(checkpoint: Checkpoint, parallel: Parallel, group: RankGroup, *, device="cpu", dtype=torch.float32):
    """The rank's share of ``checkpoint``'s model, its weights read from their slices."""
    from memt_core.models.memt import MemTForCausalLM
    from memt_core.models.weights import build_backbone, checkpoint_files

    if not checkpoint.family.shards_attention and parallel.attention_tp > 1:
        raise CheckpointError(f"{checkpoint.family.name}'s attention is not split across ranks (attention TP must be 1)")
    rank = RankCheckpoint(checkpoint, parallel)
    previous = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        with torch.device(device):
            model = MemTForCausalLM(rank, build_backbone(rank))
            lm_head = getattr(model.backbone, "lm_head", None)
            if parallel.attention_tp > 1 and lm_head is not None:
                model.backbone.lm_head = VocabParallelHead(lm_head.in_features, lm_head.out_features // parallel.attention_tp, group)
        resize_shared_experts(model, parallel, checkpoint.backbone)
        if parallel.ep > 1:
            localize_experts(model, parallel, group.rank)
    finally:
        torch.set_default_dtype(previous)
    from memt_core.families.base import resolve

    if checkpoint.family.tensor_split is None:
        raise CheckpointError(f"{checkpoint.family.name} is served on one rank only (its family names no tensor split)")
    load_shards(model, checkpoint_files(checkpoint), parallel, group.rank, kv_heads=checkpoint.backbone.get(KV_HEADS),
                backbone=checkpoint.backbone, split=resolve(checkpoint.family.tensor_split))
    if parallel.world > 1:
        if parallel.dp_attention:  # attention TP 1: each rank's attention is whole; the MLP blocks meet in rounds
            from memt_core.parallel.dp import attach

            model.exchange = attach(model, group)
        else:
            join_partial_sums(model, group)
            heads = rank.memory.num_heads
            start = (group.rank % parallel.attention_tp) * heads
            model.memory_heads = slice(start, start + heads)  # which of a whole memory's heads this rank holds
        model.group = group
        model.parallel = parallel
    return model.eval()


def resize_shared_experts(model, parallel: Parallel, backbone: dict) -> None:
    """DeepSeek-V4 reads its shared experts' width from ``moe_intermediate_size`` (``intermediate_size`` is an alias of
    it), so a rank's configuration builds them at the routed experts' share (1/(TP/EP)); they are rebuilt at their own
    (1/TP: column- and row-parallel like any dense MLP)."""
    import copy

    config = model.backbone.config
    if getattr(type(config), "attribute_map", {}).get("intermediate_size") != "moe_intermediate_size" or parallel.expert_tp == parallel.tp:
        return
    own = copy.deepcopy(config)
    own.moe_intermediate_size = int(backbone["moe_intermediate_size"]) // parallel.tp
    for layer in model.backbone.model.layers:
        shared = getattr(getattr(layer, "mlp", None), "shared_experts", None)
        if shared is not None:
            layer.mlp.shared_experts = type(shared)(own)


def localize_experts(model, parallel: Parallel, rank: int) -> None:
    """With EP, each experts module keeps its rank's experts only; the (replicated) router still picks among all, and
    a token routed elsewhere is skipped here (transformers' experts skip an index equal to their count), its part
    made on the rank that holds its expert and joined by the MLP's all-reduce."""
    for layer in model.backbone.model.layers:
        experts = getattr(getattr(layer, "mlp", None), "experts", None)
        if experts is None:
            continue
        count = experts.num_experts // parallel.ep
        first = (rank // parallel.expert_tp) * count
        experts.num_experts = count
        experts._is_expert_parallel = True  # transformers' grouped experts then zero what the kernel leaves unset for skipped rows
        experts.gate_up_proj = nn.Parameter(experts.gate_up_proj[:count].detach().clone())
        experts.down_proj = nn.Parameter(experts.down_proj[:count].detach().clone())

        def to_local(module, args, first=first, count=count):
            hidden, index, weights = args
            local = index - first
            outside = (local < 0) | (local >= count)
            return hidden, local.masked_fill(outside, count), weights.masked_fill(outside, 0)

        experts.register_forward_pre_hook(to_local)


def join_partial_sums(model, group: RankGroup) -> None:
    """One all-reduce per block after its row-parallel products: attention's (with the memory read, whose hook ran
    first), the linear attention's and the MLP's."""

    def reduce_output(module, args, output):
        if isinstance(output, tuple):
            return (group.all_reduce(output[0]), *output[1:])
        return group.all_reduce(output)

    for layer in model.backbone.model.layers:
        for name in ("self_attn", "linear_attn", "mlp"):
            module = getattr(layer, name, None)
            if module is not None:
                module.register_forward_hook(reduce_output)


# ---------------------------------------------------------------------- loading slices


def load_shards(model, files, parallel: Parallel, rank: int, *, kv_heads: int | None, backbone: dict, split=split_of) -> None:
    """Copy into each of ``model``'s tensors its slice of the safetensors ``files``, split by the family's rules
    (``split``: its ``tensor_split``)."""
    expected = model.checkpoint_state_dict()
    seen = set()
    with torch.no_grad():
        for file in files:
            with safe_open(str(file), framework="pt") as handle:
                for name in handle.keys():
                    if name not in expected:
                        raise CheckpointError(f"unexpected tensor {name!r} in {file.name}")
                    piece = _read_slice(handle.get_slice(name), name, parallel, rank, kv_heads=kv_heads, backbone=backbone,
                                        split=split(name))
                    target = expected[name]
                    if tuple(piece.shape) != tuple(target.shape):
                        raise CheckpointError(f"tensor {name!r}: rank {rank}'s slice is {list(piece.shape)}, its shard "
                                              f"{list(target.shape)}")
                    target.copy_(piece)
                    seen.add(name)
    missing = sorted(set(expected) - seen)
    if missing:
        raise CheckpointError(f"missing tensor(s): {', '.join(missing[:20])}")


def _bounds(size: int, parts: int, index: int) -> tuple[int, int]:
    step = size // parts
    return index * step, (index + 1) * step


def _cut(piece, dim: int, start: int, stop: int) -> torch.Tensor:
    index = (slice(None),) * dim + (slice(start, stop),)
    return piece[index]


def _read_slice(piece, name: str, p: Parallel, rank: int, *, kv_heads: int | None, backbone: dict, split) -> torch.Tensor:
    """Rank ``rank``'s part of one tensor (split ``split``: its kind and dimension, or None), read from its slice."""
    shape = piece.get_shape()
    if split is None or p.world == 1:
        return piece[:]
    kind, dim = split
    a = rank % p.attention_tp
    if kind == VOCAB:  # over the attention group: whole under DP attention, where each rank's logits are its own rows'
        return _cut(piece, dim, *_bounds(shape[dim], p.attention_tp, a))
    if kind == DENSE:
        return _cut(piece, dim, *_bounds(shape[dim], p.tp, rank))
    if kind == EXPERTS:
        e = rank // p.expert_tp
        t = rank % p.expert_tp
        lo, hi = _bounds(shape[0], p.ep, e)
        if name.endswith("gate_up_proj"):  # [E, 2I, H]: the gate half, then the up half
            half = shape[1] // 2
            glo, ghi = _bounds(half, p.expert_tp, t)
            return torch.cat([piece[lo:hi, glo:ghi], piece[lo:hi, half + glo:half + ghi]], dim=1)
        ilo, ihi = _bounds(shape[2], p.expert_tp, t)  # down_proj [E, H, I]
        return piece[lo:hi, :, ilo:ihi]
    if kind == KV and kv_heads and kv_heads < p.attention_tp:
        head = a * kv_heads // p.attention_tp  # replicated: the rank's group's one head
        size = shape[0] // kv_heads
        return piece[head * size:(head + 1) * size]
    if name.endswith(("in_proj_qkv.weight", "conv1d.weight")):  # q, k and v blocks, each split by head
        key_dim = int(backbone["linear_num_key_heads"]) * int(backbone["linear_key_head_dim"])
        blocks = [(0, key_dim), (key_dim, 2 * key_dim), (2 * key_dim, shape[0])]
        parts = []
        for start, stop in blocks:
            lo, hi = _bounds(stop - start, p.attention_tp, a)
            parts.append(piece[start + lo:start + hi])
        return torch.cat(parts, dim=0)
    # attention kinds: heads are contiguous rows (dim 0) or columns (dim 1)
    return _cut(piece, dim, *_bounds(shape[dim], p.attention_tp, a))
