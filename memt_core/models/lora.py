"""LoRA beside the memory: low-rank updates of a frozen backbone's linear layers, stored in the checkpoint.

A checkpoint that ships only what training made (its backbone read from elsewhere, e.g. ``memt-smol``) may carry,
besides its memory modules, a LoRA update of some backbone projections. config.json says so::

    "memt_lora": {"rank": 8, "alpha": 16}

and the safetensors hold, for each updated ``nn.Linear`` of the backbone at module path ``P`` (the backbone's own
names, e.g. ``model.layers.16.self_attn.q_proj``)::

    lora.P.A   [rank, in_features]
    lora.P.B   [out_features, rank]

Serving merges them once at load, ``W ← W + (alpha / rank) · B A``, so the engine runs a plain backbone at full
speed (:func:`merge`). Training keeps them apart, as peft's LoRA layers (:func:`inject`), and writes them back under
these names (:func:`checkpoint_names`). The update changes the backbone's answers everywhere, memory or not: a
checkpoint with LoRA no longer answers as its backbone does with memory off.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import torch
from torch import nn

from memt_core.errors import CheckpointError

PREFIX = "lora."
_PEFT = re.compile(r"^(?P<path>.+)\.lora_(?P<which>[AB])\.default\.weight$")


@dataclass(frozen=True)
class LoraConfig:
    rank: int
    alpha: float

    @property
    def scale(self) -> float:
        return self.alpha / self.rank

    @classmethod
    def from_config(cls, config: dict) -> "LoraConfig | None":
        """``memt_lora`` of a config.json, checked, or None when it has none."""
        spec = config.get("memt_lora")
        if spec is None:
            return None
        if not isinstance(spec, dict):
            raise CheckpointError("config.json: 'memt_lora' must be an object")
        rank, alpha = spec.get("rank"), spec.get("alpha")
        if not isinstance(rank, int) or isinstance(rank, bool) or rank <= 0:
            raise CheckpointError(f"config.json: 'memt_lora.rank' must be a positive integer, got {rank!r}")
        if not isinstance(alpha, (int, float)) or isinstance(alpha, bool) or alpha <= 0:
            raise CheckpointError(f"config.json: 'memt_lora.alpha' must be a positive number, got {alpha!r}")
        return cls(rank, float(alpha))


def pairs(names, config: LoraConfig | None) -> dict[str, tuple[str, str]]:
    """Module path → (A name, B name) of the ``lora.`` tensors among ``names``; incomplete pairs, or LoRA tensors
    without ``memt_lora`` (or the other way round), are a CheckpointError."""
    found = [name for name in names if name.startswith(PREFIX)]
    if config is None:
        if found:
            raise CheckpointError(f"LoRA tensor(s) such as {found[0]!r} but no 'memt_lora' in config.json")
        return {}
    paths: dict[str, dict[str, str]] = {}
    for name in found:
        path, sep, which = name[len(PREFIX):].rpartition(".")
        if not sep or which not in ("A", "B"):
            raise CheckpointError(f"tensor {name!r}: LoRA tensors are named lora.<module>.A and lora.<module>.B")
        paths.setdefault(path, {})[which] = name
    incomplete = sorted(path for path, both in paths.items() if len(both) != 2)
    if incomplete:
        raise CheckpointError(f"LoRA of {incomplete[0]!r} needs both lora.<module>.A and .B")
    if not paths:
        raise CheckpointError("config.json has 'memt_lora' but the weights hold no lora.<module>.A/.B tensors")
    return {path: (both["A"], both["B"]) for path, both in paths.items()}


def _linear(backbone: nn.Module, path: str) -> nn.Linear:
    try:
        module = backbone.get_submodule(path)
    except AttributeError:
        raise CheckpointError(f"LoRA names {path!r}, which the backbone does not have") from None
    base = getattr(module, "base_layer", module)  # a peft LoRA layer wraps the backbone's own
    if not isinstance(base, nn.Linear):
        raise CheckpointError(f"LoRA names {path!r}, a {type(base).__name__}, not a linear layer")
    return base


def check_shapes(backbone: nn.Module, found: dict[str, tuple[str, str]], shapes: dict[str, tuple[int, ...]], config: LoraConfig) -> None:
    for path, (a, b) in found.items():
        linear = _linear(backbone, path)
        want = {a: (config.rank, linear.in_features), b: (linear.out_features, config.rank)}
        for name, shape in want.items():
            if tuple(shapes[name]) != shape:
                raise CheckpointError(f"LoRA tensor {name!r} has shape {list(shapes[name])}; {path} and rank {config.rank} give {list(shape)}")


@torch.no_grad()
def merge(backbone: nn.Module, tensors: dict[str, torch.Tensor], found: dict[str, tuple[str, str]], config: LoraConfig) -> None:
    """``W ← W + scale · B A`` for every pair (computed in FP32, stored in the weight's dtype)."""
    for path, (a, b) in found.items():
        weight = _linear(backbone, path).weight
        delta = tensors[b].float() @ tensors[a].float()
        weight.copy_((weight.float() + config.scale * delta.to(weight.device)).to(weight.dtype))


def inject(backbone: nn.Module, config: LoraConfig, paths: list[str]) -> None:
    """peft LoRA layers on the backbone's linear layers at ``paths`` (trainable; B starts at zero, so the model is
    unchanged until training moves it)."""
    from peft import LoraConfig as PeftConfig
    from peft import inject_adapter_in_model

    for path in paths:
        _linear(backbone, path)
    pattern = "^(" + "|".join(re.escape(path) for path in paths) + ")$"
    inject_adapter_in_model(PeftConfig(r=config.rank, lora_alpha=config.alpha, target_modules=pattern, lora_dropout=0.0), backbone)


@torch.no_grad()
def load_unmerged(backbone: nn.Module, tensors: dict[str, torch.Tensor], found: dict[str, tuple[str, str]]) -> None:
    """Copy a checkpoint's LoRA into injected peft layers (to continue training it)."""
    for path, (a, b) in found.items():
        module = backbone.get_submodule(path)
        module.lora_A["default"].weight.copy_(tensors[a])
        module.lora_B["default"].weight.copy_(tensors[b])


def checkpoint_names(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """A backbone state dict with peft LoRA layers, under checkpoint names: ``P.base_layer.weight`` → ``P.weight``
    (the backbone's own tensor), ``P.lora_A.default.weight`` → ``lora.P.A``, ``….lora_B…`` → ``lora.P.B``."""
    renamed = {}
    for name, tensor in state.items():
        match = _PEFT.match(name)
        if match:
            renamed[f"{PREFIX}{match['path']}.{match['which']}"] = tensor
        else:
            renamed[name.replace(".base_layer.", ".")] = tensor
    return renamed
