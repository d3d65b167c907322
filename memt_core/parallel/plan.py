"""How a model is split over ranks: SGLang's parallel settings, their startup checks, and what each rank holds.

The settings are SGLang's flags: ``--tp-size`` ranks in all (the world), ``--ep-size`` of them splitting the experts
between them, ``--dp-size`` with ``--enable-dp-attention`` giving each of ``dp`` groups of ``tp / dp`` ranks its own
sessions' attention and latent memory (attention TP = tp / dp) while the experts stay shared by all ranks.

The split follows SGLang and vLLM for this backbone (Qwen3.5-MoE / Qwen3-Next; DeepSeek-V4 for its experts):

==========================================  =============================================  ====================
tensor                                      split                                          by
==========================================  =============================================  ====================
attention q/k/v, linear-attention in_proj,  column (dim 0), by head; KV heads replicated   attention TP
conv1d, ``A_log``/``dt_bias``; memory       when there are fewer than ranks
q/k/v/g/a/b, ``A_log``/``dt_bias``
attention o_proj, linear-attention          row (dim 1): each rank's partial product,      attention TP
out_proj, memory o_proj                     then one all-reduce
routed experts ``[E, …]``                   experts by EP, each expert's intermediate      EP, then TP / EP
                                            size by the rest
shared expert / dense MLP gate, up | down   column | row                                   TP
``lm_head``                                 vocabulary rows, the logits gathered           attention TP
embedding, norms, router, everything else  replicated (a token reads one embedding row)
==========================================  =============================================  ====================

This module is pure: no torch, no weights read. ``check`` refuses what cannot be split, one line each, before any
weight is read; ``rank_shares`` says what each rank holds from the safetensors headers' names and shapes.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Mapping

from memt_core.errors import CheckpointError

BACKENDS = ("auto", "nccl", "gloo")
#: bytes per element of the safetensors dtypes a checkpoint holds
DTYPE_BYTES = {"BF16": 2, "F16": 2, "F32": 4, "F64": 8, "I64": 8, "I32": 4, "I16": 2, "I8": 1, "U8": 1, "BOOL": 1}

#: backbone configuration keys (transformers' names) of the head counts attention TP must divide, with their names
HEAD_KEYS = (
    ("num_attention_heads", "attention heads"),
    ("linear_num_key_heads", "linear-attention key heads"),
    ("linear_num_value_heads", "linear-attention value heads"),
)
KV_HEADS = "num_key_value_heads"
EXPERT_KEYS = ("num_experts", "n_routed_experts")
#: backbone keys of intermediate sizes: routed experts' (split by TP / EP) and the dense or shared MLPs' (by TP)
EXPERT_INTERMEDIATE = "moe_intermediate_size"
DENSE_INTERMEDIATE = ("shared_expert_intermediate_size", "intermediate_size")


@dataclass(frozen=True)
class Parallel:
    """The parallel settings of one server: SGLang's ``--tp-size``, ``--ep-size``, ``--dp-size``,
    ``--enable-dp-attention`` and ``--dist-backend``."""

    tp: int = 1
    ep: int = 1
    dp: int = 1
    dp_attention: bool = False
    backend: str = "auto"  # auto: NCCL on CUDA, gloo on the CPU

    @property
    def world(self) -> int:
        """Ranks, one process each: the TP ranks (EP and DP attention subdivide them)."""
        return self.tp

    @property
    def attention_tp(self) -> int:
        """Ranks one attention (and latent memory) is split over: tp / dp with DP attention, else tp."""
        return self.tp // self.dp if self.dp_attention else self.tp

    @property
    def session_ranks(self) -> int:
        """Ranks that each hold their own sessions: dp with DP attention (the per-rank limits count on each), else 1."""
        return self.dp if self.dp_attention else 1

    @property
    def expert_tp(self) -> int:
        """Ranks one expert's intermediate size is split over: tp / ep."""
        return self.tp // self.ep

    def backend_for(self, device: str) -> str:
        if self.backend != "auto":
            return self.backend
        return "nccl" if device.startswith("cuda") else "gloo"

    def device_of(self, rank: int, device: str) -> str:
        """The device rank ``rank`` runs on: CUDA device ``rank`` of the visible ones, or the CPU."""
        return f"cuda:{rank}" if device.startswith("cuda") else "cpu"

    def describe(self) -> dict:
        return {"tp_size": self.tp, "ep_size": self.ep, "dp_size": self.dp, "enable_dp_attention": self.dp_attention,
                "attention_tp_size": self.attention_tp, "expert_tp_size": self.expert_tp, "dist_backend": self.backend}


def check(parallel: Parallel, *, backbone: Mapping, memory_heads: int, family, device: str,
          visible_gpus: int | None = None, deterministic_communication: bool = False) -> None:
    """Refuse settings that this checkpoint cannot be split by, or this machine cannot run (``CheckpointError``, one
    line naming the flag). ``family`` says whether DP attention is served (``dp_attention``) and whether its
    attention can be split (``shards_attention``); ``visible_gpus`` is how many CUDA devices are visible."""
    p = parallel
    for flag, value in (("--tp-size", p.tp), ("--ep-size", p.ep), ("--dp-size", p.dp)):
        if value < 1:
            raise CheckpointError(f"{flag} must be at least 1, got {value}")
    if p.backend not in BACKENDS:
        raise CheckpointError(f"--dist-backend must be one of {', '.join(BACKENDS)}, got {p.backend!r}")
    if p.backend == "nccl" and not device.startswith("cuda"):
        raise CheckpointError("--dist-backend nccl needs CUDA devices; on the CPU ranks talk over gloo (--dist-backend gloo or auto)")
    if p.world > 1 and getattr(family, "tensor_split", None) is None:
        raise CheckpointError(f"{family.name} is served on one rank only (its family names no tensor split): leave out --tp-size")
    if deterministic_communication and p.world == 1:
        raise CheckpointError("--deterministic-communication is for multi-rank engines (--tp-size above 1): one rank has no collective to fix")
    if p.dp > 1 and not p.dp_attention:
        raise CheckpointError(f"--dp-size {p.dp} without --enable-dp-attention would be {p.dp} replicas of the model: serve replicas "
                              "as separate core+proxy pairs behind a router (docs/deployment.md, scale-out)")
    if p.dp_attention:
        if not family.dp_attention:
            raise CheckpointError(f"{family.name} is served with DP attention off (the seed's startup check): leave out --enable-dp-attention")
        if p.tp != p.dp:
            raise CheckpointError(f"--enable-dp-attention needs --tp-size equal to --dp-size (attention TP 1, as the seed serves "
                                  f"{family.name}); got --tp-size {p.tp} --dp-size {p.dp}")
    if p.tp % p.ep:
        raise CheckpointError(f"--ep-size ({p.ep}) must divide --tp-size ({p.tp}): the experts are split over the TP ranks")
    experts = next((int(backbone[key]) for key in EXPERT_KEYS if backbone.get(key)), None)
    if p.ep > 1 and experts is None:
        raise CheckpointError(f"--ep-size {p.ep}: this model has no routed experts to split")
    if experts is not None and experts % p.ep:
        raise CheckpointError(f"--ep-size ({p.ep}) must divide the expert count ({experts})")
    _check_divides(EXPERT_INTERMEDIATE, backbone.get(EXPERT_INTERMEDIATE), p.expert_tp, "--tp-size / --ep-size", "routed experts' intermediate size")
    for key in DENSE_INTERMEDIATE:
        _check_divides(key, backbone.get(key), p.tp, "--tp-size", key.replace("_", " "))
    vocab = backbone.get("vocab_size")
    _check_divides("vocab_size", vocab, p.attention_tp, _attention_flag(p), "vocabulary (lm_head is split by rows)")
    if p.attention_tp > 1:
        if not family.shards_attention:
            raise CheckpointError(f"{family.name}'s attention is not split across ranks: use --enable-dp-attention with --dp-size "
                                  f"equal to --tp-size (attention TP 1), as the seed serves it")
        for key, name in HEAD_KEYS:
            _check_divides(key, backbone.get(key), p.attention_tp, _attention_flag(p), name)
        kv = backbone.get(KV_HEADS)
        if kv and kv % p.attention_tp and p.attention_tp % kv:
            raise CheckpointError(f"{_attention_flag(p)} ({p.attention_tp}) and the KV head count ({kv}) must divide one "
                                  "another (KV heads are split, or replicated when there are fewer than ranks)")
        _check_divides("memt.num_heads", memory_heads, p.attention_tp, _attention_flag(p), "latent-memory heads")
    if device.startswith("cuda") and visible_gpus is not None and visible_gpus < p.world:
        raise CheckpointError(f"--tp-size {p.tp} needs {p.world} GPUs, one per rank; {visible_gpus} visible (CUDA_VISIBLE_DEVICES)")


def _attention_flag(p: Parallel) -> str:
    return "--tp-size / --dp-size" if p.dp_attention else "--tp-size"


def _check_divides(key: str, count, ranks: int, flag: str, name: str) -> None:
    if count and ranks > 1 and int(count) % ranks:
        raise CheckpointError(f"{flag} ({ranks}) must divide the {name} ({count}, {key})")


# ---------------------------------------------------------------------- what each rank holds

ATTENTION, DENSE, EXPERTS, VOCAB, KV = "attention", "dense", "experts", "vocab", "kv"

#: (pattern over a tensor's name, how it is split): the table in this module's docstring
RULES: tuple[tuple[re.Pattern, str, int], ...] = tuple((re.compile(pattern), kind, dim) for pattern, kind, dim in (
    (r"(^|\.)lm_head\.weight$", VOCAB, 0),
    (r"\.self_attn\.q_proj\.weight$", ATTENTION, 0),
    (r"\.self_attn\.(k_proj|v_proj)\.weight$", KV, 0),
    (r"\.self_attn\.o_proj\.weight$", ATTENTION, 1),
    (r"\.linear_attn\.(in_proj_qkv|in_proj_z|in_proj_a|in_proj_b|conv1d)\.weight$", ATTENTION, 0),
    (r"\.linear_attn\.(A_log|dt_bias)$", ATTENTION, 0),
    (r"\.linear_attn\.out_proj\.weight$", ATTENTION, 1),
    (r"^memt\.layers\.\d+\.(q_proj|k_proj|v_proj|g_proj|a_proj|b_proj)\.weight$", ATTENTION, 0),
    (r"^memt\.layers\.\d+\.(A_log|dt_bias)$", ATTENTION, 0),
    (r"^memt\.layers\.\d+\.o_proj\.weight$", ATTENTION, 1),
    (r"\.mlp\.experts\.(gate_up_proj|down_proj)$", EXPERTS, 0),
    (r"\.mlp\.(shared_experts?\.)?(gate_proj|up_proj)\.weight$", DENSE, 0),
    (r"\.mlp\.(shared_experts?\.)?down_proj\.weight$", DENSE, 1),
))


def split_of(name: str) -> tuple[str, int] | None:
    """How tensor ``name`` is split (its kind and dimension), or None: replicated."""
    for pattern, kind, dim in RULES:
        if pattern.search(name):
            return kind, dim
    return None


def share(name: str, parallel: Parallel, kv_heads: int | None = None, split_of=split_of) -> float:
    """The fraction of tensor ``name`` one rank holds, by the rules ``split_of`` (a family's ``tensor_split``)."""
    split = split_of(name)
    if split is None:
        return 1.0
    kind = split[0]
    if kind == VOCAB:
        return 1 / parallel.attention_tp
    if kind == DENSE:
        return 1 / parallel.tp
    if kind == EXPERTS:
        return 1 / (parallel.ep * parallel.expert_tp)
    if kind == KV and kv_heads:
        return max(kv_heads // parallel.attention_tp, 1) / kv_heads
    return 1 / parallel.attention_tp


def rank_shares(header: Mapping[str, tuple[str, tuple[int, ...]]], parallel: Parallel, *, backbone: Mapping,
                memory_heads: int, device: str, split_of=split_of) -> list[dict]:
    """Per rank: its device, what it holds (ranges of heads, experts and vocabulary rows) and its weights in GB, from
    the safetensors headers (name → (dtype, shape))."""
    p = parallel
    kv_heads = backbone.get(KV_HEADS)
    total = held = 0.0
    for name, (dtype, shape) in header.items():
        size = DTYPE_BYTES.get(dtype, 2)
        for extent in shape:
            size *= extent
        total += size
        held += size * share(name, p, kv_heads, split_of)
    experts = next((int(backbone[key]) for key in EXPERT_KEYS if backbone.get(key)), None)
    ranks = []
    for rank in range(p.world):
        a = rank % p.attention_tp  # the rank's place in its attention group
        holds: dict = {}
        if p.dp_attention:
            holds["dp_rank"] = rank // p.attention_tp
        for key, label in HEAD_KEYS:
            if backbone.get(key):
                holds[label] = _range(int(backbone[key]), p.attention_tp, a)
        if kv_heads:
            holds["KV heads"] = _range(kv_heads, p.attention_tp, a) if kv_heads >= p.attention_tp else f"{a * kv_heads // p.attention_tp} of {kv_heads} (replicated)"
        holds["latent-memory heads"] = _range(memory_heads, p.attention_tp, a)
        if experts:
            e = rank // p.expert_tp
            holds["experts"] = _range(experts, p.ep, e) + (f", intermediate 1/{p.expert_tp}" if p.expert_tp > 1 else "")
        if backbone.get("vocab_size"):
            holds["vocabulary rows"] = _range(int(backbone["vocab_size"]), p.attention_tp, a)
        ranks.append({"rank": rank, "device": p.device_of(rank, device), "holds": holds, "weights_gb": round(held / 1e9, 6)})
    return [{**r, "of_gb": round(total / 1e9, 6)} for r in ranks]


def _range(count: int, parts: int, index: int) -> str:
    step = count // parts
    if parts == 1:
        return f"all {count}"
    if step == 1:
        return f"{index} of {count}"
    return f"{index * step}-{(index + 1) * step - 1} of {count}"
