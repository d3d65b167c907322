"""A decode step of a Qwen3.5-MoE MemT model (MemT-1.0-Nano) in fewer kernel launches: the engine's fused decode.

A decode step feeds one token per row. At small batch sizes it is bound by launching kernels (and, on the host, by
dispatching operators), not by arithmetic: transformers' modules, written for every sequence length, spend four
launches on a normalisation, a dozen on a rotary embedding, two projections where one would do. ``FusedDecode``
runs the same step, over the same cache objects and parameters, with:

* the projections that read the same input as one matrix product: per linear-attention layer q, k, v, z, β and α
  (one product where transformers makes four), per full-attention layer the query with its gate, key, value and
  the memory's query and gate, per MoE block the router, the shared expert's gate and its two input projections.
  The fused weight is one tensor and each module's parameter becomes a view of its rows: nothing is copied;
* the routed experts as two grouped matrix products (``torch.nn.functional.grouped_mm``, through transformers'
  dispatcher): the rows sorted by expert, the groups' ends found by one ``searchsorted``, the rows put back by one
  ``index_copy`` (deterministic, no atomics), no host synchronisation;
* the routing's softmax over the top-k logits (the same probabilities as a softmax over all, then the top k,
  renormalised);
* RMSNorm as ``rms_norm`` (one fused kernel on a GPU); the causal convolution's one new column as a shift, a
  product and a sum; the gated delta rule's one step as two batched products and an in-place rank-one update of
  the state; grouped-query attention without repeating keys (the query heads of one key head as its query rows).

On several ranks (``memt_core.parallel``: the model a rank's share, ``model.group`` its collectives) each block's
output product is this rank's partial sum: the residual is then added after one all-reduce of the block's parts
(``reduce``) instead of being folded into the product (``addmm``/``baddbmm``), and in a memory layer the memory read's
part joins attention's before that all-reduce. The routed experts split by EP are not supported here
(``supports``): such a model decodes with its modules.

It is the reference's arithmetic, reordered: in FP32 the two agree to rounding (tests/models/test_decode.py holds
them together, layer by layer and over whole generations); the reference stays the path of prefill, commits,
compiled steps and every cache the fused step does not know. ``scripts/bench/launches.py`` counts what it saves.
"""

from __future__ import annotations

import importlib.util
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from memt_core.models.memt import MemTForCausalLM, MemTOutput

#: The attribute of a model that keeps its fused weights, so that engines sharing one model share them.
FUSED_ATTRIBUTE = "_memt_fused_decode"


def fuse_rows(parts: list[tuple[nn.Module, str]]) -> torch.Tensor:
    """One tensor holding the rows of several 2-D parameters in order; each parameter becomes a view of its rows
    (same values, same ``requires_grad``; optimisers and ``load_state_dict`` write through to the fused tensor)."""
    params = [getattr(module, name) for module, name in parts]
    with torch.no_grad():
        fused = torch.cat([p.detach() for p in params], dim=0)
    start = 0
    for (module, name), param in zip(parts, params):
        rows = param.shape[0]
        setattr(module, name, nn.Parameter(fused[start : start + rows], requires_grad=param.requires_grad))
        start += rows
    return fused


def linear_attention_kernels(device: torch.device):
    """On CUDA, transformers' Qwen3.5 functions for the convolution's step and the gated delta rule's step where the
    packages that bind them to kernels are installed (causal-conv1d; flash-linear-attention, the GPU extra): (conv,
    delta), each None where the PyTorch step here is the one to run (always on the CPU)."""
    if torch.device(device).type != "cuda":
        return None, None
    from transformers.models.qwen3_5_moe import modeling_qwen3_5_moe as modeling

    from memt_core.models.kernels import route_qwen3_5_moe

    route_qwen3_5_moe()  # CPU tensors to the PyTorch functions, CUDA tensors to the kernels
    conv = modeling.causal_conv1d_update if importlib.util.find_spec("causal_conv1d") is not None else None
    delta = modeling.torch_recurrent_gated_delta_rule if importlib.util.find_spec("fla") is not None else None
    return conv, delta


def zero_centred(norm: nn.Module) -> torch.Tensor:
    """The FP32 weight ``1 + w`` of a Qwen3.5 RMSNorm (which scales by ``1 + w``)."""
    return (1.0 + norm.weight.detach().float()).contiguous()


@dataclass
class _Moe:
    """One sparse MoE block's fused parameters."""

    fused: torch.Tensor  # [E + 1 + 2·I_shared, D]: router, shared gate, shared gate_proj, shared up_proj
    experts: nn.Module  # transformers' experts (gate_up_proj [E, 2I, D], down_proj [E, D, I])
    shared_down: torch.Tensor  # [D, I_shared]
    num_experts: int
    top_k: int
    shared: int
    expert_ends: torch.Tensor  # [E] 0..E-1, the values whose right insertion points are the groups' ends


@dataclass
class _LinearAttention:
    fused: torch.Tensor  # [2·Kd + Vd + Vd + Hv + Hv, D]: q k v (conv input), z, β, α
    conv_weight: torch.Tensor  # [C, K]
    conv_bias: torch.Tensor | None
    norm_weight: torch.Tensor  # [Vd_head] gated RMSNorm weight
    norm_eps: float
    out: torch.Tensor  # [D, Vd]
    key_heads: int
    value_heads: int
    key_dim: int
    value_dim: int
    qk_scale: torch.Tensor  # [2, 1, 1]: 1/dk for q (its L2 norm and the rule's 1/√dk), 1/√dk for k, FP32
    gate_sign: torch.Tensor  # [2·Hv]: −1 on b, 1 on a
    gate_shift: torch.Tensor  # [2·Hv]: 0 on b, dt_bias on a (FP32)
    gate_scale: torch.Tensor  # [2·Hv]: −1 on b, −exp(A_log) on a (FP32)


@dataclass
class _FullAttention:
    fused: torch.Tensor  # [2·Hq·d + 2·Hkv·d (+ 2·H·K memory), D]: q with its gate, k, v (, memory q, memory g)
    qk_norm: torch.Tensor  # [Hq + Hkv, d] FP32 (1 + w) of q_norm and k_norm
    qk_eps: float
    out: torch.Tensor  # [D, Hq·d]
    heads: int
    kv_heads: int
    head_dim: int
    memory: nn.Module | None  # the memory module beside this layer, if any
    memory_scale: torch.Tensor | None  # [K] 1/√K: an RMSNorm's weight that makes it an L2 normalisation


@dataclass
class _Layer:
    index: int
    input_norm: torch.Tensor
    post_norm: torch.Tensor
    eps: float
    mixer: _LinearAttention | _FullAttention
    moe: _Moe


class FusedDecode:
    """The decode step (``T = 1``) of a Qwen3.5-MoE ``MemTForCausalLM`` in fewer launches; call it like the model."""

    def __init__(self, model: MemTForCausalLM):
        self.model = model
        backbone = model.backbone
        text = backbone.model
        self.config = backbone.config
        prepared = getattr(model, FUSED_ATTRIBUTE, None)
        if prepared is None or not self._aliased(model, prepared):  # new, or the model was copied or moved since
            prepared = self._prepare(model)
            setattr(model, FUSED_ATTRIBUTE, prepared)
        self.layers: list[_Layer] = prepared
        group = getattr(model, "group", None)  # a rank's share: its partial sums are joined by an all-reduce
        self.reduce = group.all_reduce if group is not None and group.world > 1 else None
        self.conv_kernel, self.delta_kernel = linear_attention_kernels(next(model.parameters()).device)
        self.embed = text.embed_tokens
        self.final_norm = zero_centred(text.norm)
        self.final_eps = text.norm.eps
        self.lm_head = backbone.lm_head
        rotary = text.rotary_emb
        inv_freq = rotary.inv_freq.detach().float()
        scaling = float(rotary.attention_scaling)
        full = next((layer.mixer for layer in self.layers if isinstance(layer.mixer, _FullAttention)), None)
        if full is not None:
            # the whole head's frequencies (0 where rotary leaves a dimension alone: cos 1, sin 0), its cos scaling,
            # and rotate_half as a gather with the sign folded into sin: x·cos + x[perm]·sin
            d, half = full.head_dim, inv_freq.numel()
            rest = d - 2 * half
            zeros, device = inv_freq.new_zeros(rest), inv_freq.device
            self.frequencies = torch.cat([inv_freq, inv_freq, zeros])
            self.cos_scale = torch.cat([inv_freq.new_full((2 * half,), scaling), inv_freq.new_ones(rest)])
            self.sin_scale = torch.cat([inv_freq.new_full((half,), -scaling), inv_freq.new_full((half,), scaling), zeros])
            self.perm = torch.cat([torch.arange(half, 2 * half), torch.arange(0, half), torch.arange(2 * half, d)]).to(device)

    @staticmethod
    def supports(model: MemTForCausalLM) -> bool:
        """Whether ``model``'s backbone is one this step knows (Qwen3.5-MoE's text model, SDPA attention)."""
        backbone = model.backbone
        parallel = getattr(model, "parallel", None)
        if parallel is not None and parallel.ep > 1:  # its experts module routes to this rank's experts only
            return False
        return type(backbone).__name__ == "Qwen3_5MoeForCausalLM" and backbone.config._attn_implementation == "sdpa"

    # ------------------------------------------------------------------ preparation

    @staticmethod
    def _aliased(model: MemTForCausalLM, prepared: list[_Layer]) -> bool:
        """Whether the prepared fused weights are still what the model's parameters view."""
        layer = model.backbone.model.layers[0]
        first = layer.linear_attn.in_proj_qkv if layer.block_type == "linear_attention" else layer.self_attn.q_proj
        return first.weight.data_ptr() == prepared[0].mixer.fused.data_ptr()

    @staticmethod
    def _prepare(model: MemTForCausalLM) -> list[_Layer]:
        text = model.backbone.model
        memory_layers = set(model.memory_layers)
        layers = []
        for index, layer in enumerate(text.layers):
            if layer.block_type == "linear_attention":
                mixer = FusedDecode._prepare_linear(layer.linear_attn)
            else:
                memory = model.memory_module(index) if index in memory_layers else None
                mixer = FusedDecode._prepare_full(layer.self_attn, memory)
            layers.append(_Layer(
                index=index, input_norm=zero_centred(layer.input_layernorm), post_norm=zero_centred(layer.post_attention_layernorm),
                eps=layer.input_layernorm.eps, mixer=mixer, moe=FusedDecode._prepare_moe(layer.mlp),
            ))
        return layers

    @staticmethod
    def _prepare_linear(attn: nn.Module) -> _LinearAttention:
        fused = fuse_rows([(attn.in_proj_qkv, "weight"), (attn.in_proj_z, "weight"), (attn.in_proj_b, "weight"), (attn.in_proj_a, "weight")])
        heads, key_dim = attn.num_v_heads, attn.head_k_dim
        ones = torch.ones(heads, device=fused.device)
        neg_a = -attn.A_log.detach().float().exp()
        return _LinearAttention(
            fused=fused, conv_weight=attn.conv1d.weight.detach()[:, 0, :], conv_bias=attn.conv1d.bias,
            norm_weight=attn.norm.weight.detach().float(), norm_eps=attn.norm.variance_epsilon, out=attn.out_proj.weight,
            key_heads=attn.num_k_heads, value_heads=heads, key_dim=key_dim, value_dim=attn.head_v_dim,
            qk_scale=torch.tensor([1.0 / key_dim, key_dim ** -0.5], device=fused.device).view(2, 1, 1),
            gate_sign=torch.cat([-ones, ones]), gate_shift=torch.cat([0 * ones, attn.dt_bias.detach().float()]),
            gate_scale=torch.cat([-ones, neg_a]),
        )

    @staticmethod
    def _prepare_full(attn: nn.Module, memory: nn.Module | None) -> _FullAttention:
        parts = [(attn.q_proj, "weight"), (attn.k_proj, "weight"), (attn.v_proj, "weight")]
        if memory is not None:
            parts += [(memory.q_proj, "weight"), (memory.g_proj, "weight")]
        if any(getattr(module, "bias", None) is not None for module, _ in parts):
            raise ValueError("the fused decode step takes attention projections without bias")
        heads, kv_heads = attn.config.num_attention_heads, attn.config.num_key_value_heads
        qk_norm = torch.cat([zero_centred(attn.q_norm).expand(heads, -1), zero_centred(attn.k_norm).expand(kv_heads, -1)])
        fused = fuse_rows(parts)
        memory_scale = None if memory is None else torch.full((memory.key_dim,), memory.key_dim ** -0.5, device=fused.device)
        return _FullAttention(
            fused=fused, qk_norm=qk_norm, qk_eps=attn.q_norm.eps, out=attn.o_proj.weight,
            heads=heads, kv_heads=kv_heads, head_dim=attn.head_dim, memory=memory, memory_scale=memory_scale,
        )

    @staticmethod
    def _prepare_moe(mlp: nn.Module) -> _Moe:
        shared = mlp.shared_expert
        fused = fuse_rows([(mlp.gate, "weight"), (mlp.shared_expert_gate, "weight"), (shared.gate_proj, "weight"), (shared.up_proj, "weight")])
        experts = mlp.experts
        if getattr(experts, "has_bias", False) or not getattr(experts, "has_gate", True):
            raise ValueError("the fused decode step takes gated experts without bias")
        return _Moe(
            fused=fused, experts=experts, shared_down=shared.down_proj.weight, num_experts=mlp.gate.num_experts,
            top_k=mlp.gate.top_k, shared=shared.intermediate_size,
            expert_ends=torch.arange(mlp.gate.num_experts, device=fused.device),
        )

    # ------------------------------------------------------------------ the step

    def can_run(self, ids: torch.Tensor, cache) -> bool:
        """Whether this step can advance ``cache`` by ``ids`` (one token a row; every layer's cache started). A
        full-attention layer is advanced by its ``update`` alone, so a cache layer class that returns the batch's
        keys and values from it as ``DynamicLayer`` does may say so with ``fused_decode = True`` (the paged pool's)."""
        from transformers.cache_utils import DynamicLayer, LinearAttentionLayer

        if cache is None or ids.dim() != 2 or ids.shape[1] != 1 or len(cache.layers) != len(self.layers):
            return False
        for layer, cached in zip(self.layers, cache.layers):
            if isinstance(layer.mixer, _LinearAttention):
                if type(cached) is not LinearAttentionLayer or cached.record_past or cached.conv_states.get(0) is None \
                        or cached.recurrent_states.get(0) is None:
                    return False
            elif not (type(cached) is DynamicLayer or getattr(cached, "fused_decode", False)) or not cached.is_initialized:
                return False  # a full-attention cache the step knows: transformers' growing one, or one marked so
        return True

    @torch.no_grad()
    def __call__(
        self,
        input_ids: torch.Tensor,
        *,
        memory: dict[int, torch.Tensor] | None = None,
        past_key_values=None,
        attention_mask: torch.Tensor | None = None,
        position_ids: torch.Tensor | None = None,
        **_: object,
    ) -> MemTOutput:
        """One decode step: ``input_ids [B, 1]``, ``attention_mask [B, L + 1]`` (0 on left padding), ``position_ids
        [B, 1]``, ``memory`` per memory layer ``[B, H, K, V]`` or None. Returns logits ``[B, 1, vocab]`` and the cache
        (the same object, advanced)."""
        cache = past_key_values
        rows = input_ids.shape[0]
        h = self.embed(input_ids.reshape(rows))  # [B, D]
        dtype = h.dtype
        rotary = mask = None
        for layer in self.layers:
            x = self._norm(h, layer.input_norm, layer.eps)
            if isinstance(layer.mixer, _LinearAttention):
                h = self._linear_attention(layer.mixer, x, h, cache.layers[layer.index])
            else:
                if rotary is None:
                    rotary = self._rotary(position_ids.reshape(rows), dtype)
                    if attention_mask is not None:  # additive: 0 where a row attends, the dtype's minimum on its padding
                        mask = attention_mask.to(dtype).sub_(1).mul_(-torch.finfo(dtype).min)[:, None, None, :]
                read = memory.get(layer.index) if memory else None
                h = self._full_attention(layer.mixer, x, h, cache.layers[layer.index], rotary, mask, read)
            h = self._moe(layer.moe, self._norm(h, layer.post_norm, layer.eps), h, self.reduce)
        h = self._norm(h, self.final_norm, self.final_eps)
        logits = self.lm_head(h)
        return MemTOutput(logits=logits[:, None, :], past_key_values=cache)

    @staticmethod
    def _norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
        """Qwen3.5's RMSNorm (in FP32, scaled by ``1 + w``) as one fused kernel."""
        return F.rms_norm(x.float(), (x.shape[-1],), weight, eps).to(x.dtype)

    def _rotary(self, positions: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        """Per row, ``cos`` and signed ``sin`` over the whole head, ``[B, 1, d]``, in the model's dtype (as transformers
        rounds them)."""
        angles = positions[:, None].float() * self.frequencies  # [B, d]
        cos = (angles.cos() * self.cos_scale).to(dtype)
        sin = (angles.sin() * self.sin_scale).to(dtype)
        return cos[:, None, :], sin[:, None, :]

    def _linear_attention(self, p: _LinearAttention, x: torch.Tensor, residual: torch.Tensor, cached) -> torch.Tensor:
        """A gated delta net layer's step; returns ``residual`` plus its output."""
        rows = x.shape[0]
        keys, values, heads = p.key_heads * p.key_dim, p.value_heads * p.value_dim, p.value_heads
        conv_dim = 2 * keys + values
        proj = F.linear(x, p.fused)
        mixed, z = proj[:, :conv_dim], proj[:, conv_dim : conv_dim + values]
        b_and_a = proj[:, conv_dim + values :]  # [B, 2·Hv]

        # the causal convolution's new column: shift the window by one, weigh it, sum (or causal-conv1d's kernel)
        state = cached.conv_states[0]
        if self.conv_kernel is not None:
            conv = self.conv_kernel(mixed[:, :, None], state, p.conv_weight, p.conv_bias, "silu")[:, :, 0]
        else:
            window = torch.cat([state[:, :, 1:], mixed[:, :, None].to(state.dtype)], dim=-1)  # [B, C, K]
            state.copy_(window)
            conv = (window.to(p.conv_weight.dtype) * p.conv_weight).sum(-1)
            if p.conv_bias is not None:
                conv = conv + p.conv_bias
            conv = F.silu(conv).to(x.dtype)

        # log β = −softplus(−b) and log α = −e^A · softplus(a + dt): one softplus for both
        log_beta_decay = F.softplus(torch.addcmul(p.gate_shift, b_and_a.float(), p.gate_sign)) * p.gate_scale
        recurrent = cached.recurrent_states[0]
        if self.delta_kernel is not None:  # flash-linear-attention's fused recurrent step, as transformers calls it
            o, final = self.delta_kernel(
                conv[:, :keys].reshape(rows, 1, p.key_heads, p.key_dim), conv[:, keys : 2 * keys].reshape(rows, 1, p.key_heads, p.key_dim),
                conv[:, 2 * keys :].reshape(rows, 1, heads, p.value_dim), g=log_beta_decay[:, None, heads:],
                beta=log_beta_decay[:, None, :heads].exp().to(x.dtype), initial_state=recurrent, output_final_state=True,
                use_qk_l2norm_in_kernel=True,
            )
            recurrent.copy_(final)
        else:
            o = self._delta_step(p, conv, log_beta_decay.exp(), recurrent)

        # gated RMSNorm (FP32), then the output projection added to the residual
        o = F.rms_norm(o.reshape(rows, heads, p.value_dim).to(x.dtype).float(), (p.value_dim,), p.norm_weight, p.norm_eps)
        o = (o.to(x.dtype) * F.silu(z.reshape(rows, heads, p.value_dim).float())).to(x.dtype).reshape(rows, values)
        if self.reduce is None:
            return torch.addmm(residual, o, p.out.t())
        return residual + self.reduce(o @ p.out.t())  # several ranks: the parts summed, then the residual

    @staticmethod
    def _delta_step(p: _LinearAttention, conv: torch.Tensor, beta_decay: torch.Tensor, recurrent: torch.Tensor) -> torch.Tensor:
        """One step of the gated delta rule in PyTorch, the state updated in place: S ← αS; S ← S + k βᵀ(v − Sᵀk);
        o = Sᵀq (q and k L2-normalised, q over √dk). Returns o ``[B·Hv, 1, dv]`` (FP32)."""
        rows, heads = conv.shape[0], p.value_heads
        keys = p.key_heads * p.key_dim
        # q and k L2-normalised together in FP32 (x·rsqrt(Σx² + ε) as an RMSNorm of ε/dk, over √dk), q also over
        # √dk (the rule's scale), then repeated over the value heads they serve
        qk = conv[:, : 2 * keys].reshape(rows, 2, p.key_heads, p.key_dim).float()
        qk = F.rms_norm(qk, (p.key_dim,), None, 1e-6 / p.key_dim) * p.qk_scale
        if heads > p.key_heads:
            qk = qk.repeat_interleave(heads // p.key_heads, dim=2)
        q = qk[:, 0].reshape(rows * heads, 1, p.key_dim)
        k = qk[:, 1].reshape(rows * heads, 1, p.key_dim)
        v = conv[:, 2 * keys :].reshape(rows * heads, 1, p.value_dim).float()
        beta = beta_decay[:, :heads].reshape(rows * heads, 1, 1)
        decay = beta_decay[:, heads:].reshape(rows * heads, 1, 1)
        s = recurrent if recurrent.dtype == torch.float32 else recurrent.float()
        s = s.view(rows * heads, p.key_dim, p.value_dim)
        s.mul_(decay)
        delta = (v - torch.bmm(k, s)) * beta  # [B·Hv, 1, dv]
        s.baddbmm_(k.transpose(1, 2), delta)
        o = torch.bmm(q, s)
        if s.data_ptr() != recurrent.data_ptr():
            recurrent.copy_(s.view_as(recurrent))
        return o

    def _full_attention(self, p: _FullAttention, x: torch.Tensor, residual: torch.Tensor, cached, rotary, mask, read) -> torch.Tensor:
        """A full-attention layer's step (with the memory read beside it); returns ``residual`` plus its output."""
        rows, d = x.shape[0], p.head_dim
        proj = F.linear(x, p.fused)
        q_and_gate = proj[:, : 2 * p.heads * d].view(rows, p.heads, 2 * d)
        start = 2 * p.heads * d
        k = proj[:, start : start + p.kv_heads * d].view(rows, p.kv_heads, d)
        v = proj[:, start + p.kv_heads * d : start + 2 * p.kv_heads * d].view(rows, p.kv_heads, 1, d)

        qk = torch.cat([q_and_gate[:, :, :d], k], dim=1)  # [B, Hq + Hkv, d]
        qk = (F.rms_norm(qk.float(), (d,), None, p.qk_eps) * p.qk_norm).to(x.dtype)
        cos, sin = rotary
        qk = torch.addcmul(qk * cos, qk[..., self.perm], sin)
        group = p.heads // p.kv_heads
        q = qk[:, : p.heads].reshape(rows, p.kv_heads, group, d)  # the query heads of one key head as its rows
        keys, values = cached.update(qk[:, p.heads :, None, :], v)
        attn = F.scaled_dot_product_attention(q, keys, values, attn_mask=mask, scale=d ** -0.5)  # [B, Hkv, group, d]
        attn = (attn.reshape(rows, p.heads, d) * torch.sigmoid(q_and_gate[:, :, d:])).reshape(rows, p.heads * d)
        fold = self.reduce is None  # one rank: the residual folded into the products
        h = torch.addmm(residual, attn, p.out.t()) if fold else attn @ p.out.t()

        if p.memory is not None and read is not None:
            memory = p.memory
            start += 2 * p.kv_heads * d
            heads, key_dim, value_dim = memory.num_heads, memory.key_dim, memory.value_dim
            # F.normalize as an RMSNorm over √K (ε far below any norm a query has)
            mq = F.rms_norm(proj[:, start : start + heads * key_dim].reshape(rows * heads, 1, key_dim).float(),
                            (key_dim,), p.memory_scale, 1e-24)
            gate = torch.sigmoid(proj[:, start + heads * key_dim :].reshape(rows * heads, 1, value_dim).float())
            y = gate * torch.bmm(mq, read.reshape(rows * heads, key_dim, value_dim).float())
            h = torch.addmm(h, y.reshape(rows, heads * value_dim).to(x.dtype), memory.o_proj.weight.t())
        return h if fold else residual + self.reduce(h)  # attention's part and the memory's: one all-reduce

    @staticmethod
    def _moe(p: _Moe, x: torch.Tensor, residual: torch.Tensor, reduce=None) -> torch.Tensor:
        """A sparse MoE block's step; returns ``residual`` plus its output (on several ranks, plus the sum of every
        rank's part: ``reduce``)."""
        from transformers.integrations.moe import _grouped_mm

        rows, experts, k = x.shape[0], p.num_experts, p.top_k
        proj = F.linear(x, p.fused)
        top, chosen = torch.topk(proj[:, :experts].float(), k, dim=-1)
        weights = torch.softmax(top, dim=-1).to(x.dtype)  # = softmax over all experts, top k, renormalised

        # routed experts: rows sorted by expert, two grouped products, rows put back, weighed and summed per token
        ids, order = torch.sort(chosen.reshape(-1))
        ends = torch.searchsorted(ids, p.expert_ends, right=True, out_int32=True)
        hidden = x.index_select(0, torch.div(order, k, rounding_mode="floor"))
        up = _grouped_mm(hidden, p.experts.gate_up_proj.transpose(-2, -1), ends)
        gate, up = up.chunk(2, dim=-1)
        down = _grouped_mm(p.experts.act_fn(gate) * up, p.experts.down_proj.transpose(-2, -1), ends)
        down = torch.empty_like(down).index_copy_(0, order, down).view(rows, k, -1)
        if reduce is None:
            h = torch.baddbmm(residual[:, None, :], weights[:, None, :], down)[:, 0]  # residual + Σ_j w_j · expert_j(x)
        else:
            h = torch.bmm(weights[:, None, :], down)[:, 0]

        # the shared expert, its sigmoid gate (a number per row) taken before the down projection
        gate = torch.sigmoid(proj[:, experts : experts + 1])
        shared = F.silu(proj[:, experts + 1 : experts + 1 + p.shared]) * (proj[:, experts + 1 + p.shared :] * gate)
        h = torch.addmm(h, shared, p.shared_down.t())
        return h if reduce is None else residual + reduce(h)
