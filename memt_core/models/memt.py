"""A MemT causal LM: a transformers backbone, unchanged, with a memory module beside chosen attention layers.

The backbone is transformers' own class, chosen by the checkpoint's family (Qwen3.5-MoE text model
for Nano, DeepSeek-V4 for Flash; see :mod:`memt_core.families`). Each memory layer's attention module gets a forward hook that sees the attention's normed input and
adds the memory read to the attention output, so the residual stream receives it exactly as DESIGN
§4 describes, and parameter names of the backbone stay its own.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import partial
from typing import Any, Mapping

import torch
from torch import nn

from memt_core.checkpoint import Checkpoint
from memt_core.models.lora import checkpoint_names
from memt_core.models.memory import MemoryModule, WriteInputs


@dataclass
class MemTOutput:
    """Logits ``[B, T', vocab]``, the backbone's cache, and per memory layer what was collected to write."""

    logits: torch.Tensor
    past_key_values: Any = None
    writes: dict[int, WriteInputs] = field(default_factory=dict)


@dataclass
class _Pass:
    """What one forward pass reads and collects; set for the duration of ``forward``."""

    memory: Mapping[int, torch.Tensor] | None
    collect: bool
    writes: dict[int, WriteInputs] = field(default_factory=dict)


class MemoryLayers(nn.Module):
    """Holds the memory modules; their state-dict names are ``memt.layers.<layer>.<tensor>``."""

    def __init__(self, modules: dict[int, MemoryModule]):
        super().__init__()
        self.layers = nn.ModuleDict({str(layer): module for layer, module in modules.items()})


class MemTForCausalLM(nn.Module):
    """Backbone + memory. ``forward`` takes the memory to read per layer (``[B, H, K, V]``) or none."""

    def __init__(self, checkpoint: Checkpoint, backbone: nn.Module):
        super().__init__()
        memory = checkpoint.memory
        self.checkpoint = checkpoint
        self.backbone = backbone
        self.memt = MemoryLayers(
            {
                layer: MemoryModule(checkpoint.hidden_size, memory.num_heads, memory.key_dim, memory.value_dim)
                for layer in memory.memory_layers
            }
        )
        self.memory_layers = tuple(memory.memory_layers)
        self._pass: _Pass | None = None
        for layer in self.memory_layers:
            self.attention(layer).register_forward_hook(partial(self._memory_hook, layer), with_kwargs=True)

    def attention(self, layer: int) -> nn.Module:
        """The native attention module of backbone layer ``layer``, where its family says it sits."""
        return self.checkpoint.family.attention(self.backbone, layer)

    def memory_module(self, layer: int) -> MemoryModule:
        return self.memt.layers[str(layer)]

    @property
    def config(self):
        return self.backbone.config

    def forward(
        self,
        input_ids: torch.Tensor,
        *,
        memory: Mapping[int, torch.Tensor] | None = None,
        collect_writes: bool = False,
        past_key_values: Any = None,
        use_cache: bool = False,
        attention_mask: torch.Tensor | None = None,
        position_ids: torch.Tensor | None = None,
        logits_to_keep: int = 0,
    ) -> MemTOutput:
        """Run the backbone once; memory layers read ``memory`` (absent → nothing added)."""
        self._pass = _Pass(memory=memory, collect=collect_writes)
        try:
            out = self.backbone(
                input_ids=input_ids,
                attention_mask=attention_mask,
                position_ids=position_ids,
                past_key_values=past_key_values,
                use_cache=use_cache,
                logits_to_keep=logits_to_keep,
            )
            writes = self._pass.writes
        finally:
            self._pass = None
        return MemTOutput(logits=out.logits, past_key_values=out.past_key_values, writes=writes)

    def _memory_hook(self, layer: int, module: nn.Module, args: tuple, kwargs: dict, output: Any):
        """After attention layer ``layer``: collect its write inputs, add its memory read. Registered as a bound
        method (not a closure) so that ``copy.deepcopy`` of the model hooks the copy, not the original."""
        current = self._pass
        if current is None:
            return None
        x = kwargs["hidden_states"] if "hidden_states" in kwargs else args[0]
        memory_module = self.memory_module(layer)
        if current.collect:
            current.writes[layer] = memory_module.write_inputs(x)
        state = current.memory.get(layer) if current.memory else None
        if state is None:
            return None
        attn_output, *rest = output
        return (attn_output + memory_module.read(x, state).to(attn_output.dtype), *rest)

    def checkpoint_state_dict(self) -> dict[str, torch.Tensor]:
        """Tensors as a checkpoint stores them: backbone names unchanged, memory under ``memt.layers.``, and LoRA layers
        being trained as ``lora.<module>.A/B`` (``memt_core.models.lora``)."""
        state = self.state_dict()
        backbone = checkpoint_names({name[len("backbone."):]: t for name, t in state.items() if name.startswith("backbone.")})
        return {**backbone, **{name: t for name, t in state.items() if not name.startswith("backbone.")}}
