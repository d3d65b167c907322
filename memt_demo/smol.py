"""The demo model v4's checkpoint: latent memory trained onto SmolLM2-135M-Instruct, the backbone frozen.

A ``memt-smol`` checkpoint (:mod:`memt_core.families.smol`) ships only what training made. Its skeleton is
written here from the converted backbone (``python -m memt_core.backbones``):

* ``config.json``: the backbone's Llama configuration as ``backbone_configs``, the memory geometry (``memt``), and
  ``memt_backbone`` naming the converted file and its SHA-256, so that a checkpoint is never served on another one;
* the backbone's tokenizer files, and ``chat_template.jinja``: SmolLM2's ChatML with tools (no thinking);
* with ``TrainConfig.lora_rank``, ``memt_lora``: LoRA on the backbone's projections from the lowest memory layer up,
  trained beside the memory (``memt_core.models.lora``; merged into the backbone when served).

:func:`init_model` loads the backbone's weights, gives each memory layer fresh projections and freezes every
backbone parameter: gradients reach only the memory modules, and nothing below the lowest memory layer is
differentiated (its activations need no graph). With an empty memory the model's logits are the backbone's own.
"""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import torch

from memt_core.families import SMOL, get
from memt_core.families.smol import BACKBONE_FILE, backbone_home
from memt_demo.config import memory_config

CHECKPOINT_ID = "memt-smol-demo"
#: The backbone's tokenizer files copied into the checkpoint (its own chat template is replaced by ours).
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json")


def smol_config(backbone: str, shape, *, lora_rank: int = 0, lora_alpha: float = 16.0) -> dict:
    """config.json of a memt-smol checkpoint on the converted ``backbone`` with ``shape``'s memory geometry."""
    family = get(SMOL)
    directory = backbone_home() / backbone
    source = json.loads((directory / "SOURCE.json").read_text())
    llama = json.loads((directory / "config.json").read_text())
    return {
        "model_type": family.model_type,
        "architectures": [family.architecture],
        "memt_checkpoint_id": CHECKPOINT_ID,
        "dtype": "bfloat16",
        "backbone_configs": {**llama, "model_type": family.backbone_type},
        "memt_backbone": {
            "name": backbone,
            "file": BACKBONE_FILE,
            "sha256": source["sha256"],
            "title": source["title"],
            "license": source["license"],
            "source": f"{source['package']} {source['version']} ({source['file']}), converted by python -m memt_core.backbones",
        },
        **memory_config(shape),
        **({"memt_lora": {"rank": lora_rank, "alpha": lora_alpha}} if lora_rank else {}),
    }


def write_skeleton(directory: str | Path, backbone: str, shape, *, lora_rank: int = 0, lora_alpha: float = 16.0) -> None:
    """config.json, the backbone's tokenizer and our chat template in ``directory``."""
    from memt_core.templates import template_text

    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    source = backbone_home() / backbone
    if not (source / BACKBONE_FILE).is_file():
        raise FileNotFoundError(f"the backbone {backbone!r} is not converted: run `python -m memt_core.backbones {backbone}`")
    for name in TOKENIZER_FILES:
        shutil.copyfile(source / "tokenizer" / name, directory / name)
    (directory / "chat_template.jinja").write_text(template_text("smol_chat_template.jinja"), encoding="utf-8")
    config = smol_config(backbone, shape, lora_rank=lora_rank, lora_alpha=lora_alpha)
    (directory / "config.json").write_text(json.dumps(config, indent=2) + "\n", encoding="utf-8")


def init_model(directory: str | Path, config):
    """The backbone's weights and fresh memory modules (FP32, CPU), the backbone frozen."""
    from safetensors import safe_open

    from memt_core.checkpoint import read_checkpoint
    from memt_core.models.memt import MemTForCausalLM
    from memt_core.models.weights import build_backbone

    checkpoint = read_checkpoint(directory)
    torch.manual_seed(config.seed)
    model = MemTForCausalLM(checkpoint, build_backbone(checkpoint))
    (path,) = checkpoint.family.backbone_weights(checkpoint.path, checkpoint.config)
    parameters = dict(model.backbone.state_dict())
    with torch.no_grad(), safe_open(str(path), framework="pt") as handle:
        for name in handle.keys():
            parameters[name].copy_(handle.get_tensor(name))
        for layer in model.memory_layers:
            module = model.memory_module(layer)
            module.reset_parameters(std=config.memory_init_std)
            torch.nn.init.normal_(module.o_proj.weight, std=config.memory_out_std)
            module.A_log.fill_(config.decay_a_log)
            module.dt_bias.fill_(config.decay_dt_bias)
    freeze_backbone(model)
    if config.lora_rank:
        from memt_core.models import lora

        lora.inject(model.backbone, lora.LoraConfig(config.lora_rank, config.lora_alpha), lora_paths(model, config.lora_targets))
    return model


def lora_paths(model, targets: tuple[str, ...]) -> list[str]:
    """The backbone's linear layers named ``targets`` in the layers from the lowest memory layer up."""
    lowest = min(model.memory_layers)
    paths = []
    for name, module in model.backbone.named_modules():
        layer = re.match(r"^model\.layers\.(\d+)\.", name)
        if isinstance(module, torch.nn.Linear) and layer and int(layer[1]) >= lowest and name.rsplit(".", 1)[-1] in targets:
            paths.append(name)
    return paths


def freeze_backbone(model) -> int:
    """Stop gradients to every backbone parameter; returns how many parameters stay trainable."""
    for parameter in model.backbone.parameters():
        parameter.requires_grad_(False)
    return sum(p.numel() for p in model.parameters() if p.requires_grad)
