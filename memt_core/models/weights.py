"""Checkpoint weights: BF16 safetensors, one file or shards with an index, checked before loading.

Tensor names: backbone tensors keep the backbone class's own names (``model.layers.3.self_attn.q_proj.weight``,
``lm_head.weight``, …); memory tensors are ``memt.layers.<layer>.<name>`` with, for H heads, key
size K, value size V and hidden size D::

    q_proj.weight [H·K, D]   k_proj.weight [H·K, D]   v_proj.weight [H·V, D]
    b_proj.weight [H, D]     a_proj.weight [H, D]     g_proj.weight [H·V, D]
    o_proj.weight [D, H·V]   A_log [H]                dt_bias [H]
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors import safe_open
from safetensors.torch import save_file

from memt_core.checkpoint import MEMORY_PREFIX, Checkpoint, read_checkpoint
from memt_core.errors import CheckpointError
from memt_core.families.base import resolve
from memt_core.models import lora as lora_weights
from memt_core.models.memt import MemTForCausalLM

INDEX_FILE = "model.safetensors.index.json"
SINGLE_FILE = "model.safetensors"


def memory_tensor_shapes(checkpoint: Checkpoint) -> dict[str, tuple[int, ...]]:
    """Every memory tensor the checkpoint must hold, with its shape."""
    memory, hidden = checkpoint.memory, checkpoint.hidden_size
    heads, key, value = memory.num_heads, memory.key_dim, memory.value_dim
    shapes = {}
    for layer in memory.memory_layers:
        prefix = f"{MEMORY_PREFIX}{layer}."
        shapes.update(
            {
                prefix + "q_proj.weight": (heads * key, hidden),
                prefix + "k_proj.weight": (heads * key, hidden),
                prefix + "v_proj.weight": (heads * value, hidden),
                prefix + "b_proj.weight": (heads, hidden),
                prefix + "a_proj.weight": (heads, hidden),
                prefix + "g_proj.weight": (heads * value, hidden),
                prefix + "o_proj.weight": (hidden, heads * value),
                prefix + "A_log": (heads,),
                prefix + "dt_bias": (heads,),
            }
        )
    return shapes


def weight_files(root: Path) -> list[Path]:
    """The safetensors files of a checkpoint: the shards named by the index, or the single file."""
    index = root / INDEX_FILE
    if index.is_file():
        try:
            weight_map = json.loads(index.read_text())["weight_map"]
        except (json.JSONDecodeError, KeyError) as exc:
            raise CheckpointError(f"{INDEX_FILE} is not a valid safetensors index: {exc}") from exc
        files = sorted(set(weight_map.values()))
        missing = [name for name in files if not (root / name).is_file()]
        if missing:
            raise CheckpointError(f"{INDEX_FILE} names missing shard(s): {', '.join(missing)}")
        return [root / name for name in files]
    if (root / SINGLE_FILE).is_file():
        return [root / SINGLE_FILE]
    files = sorted(root.glob("*.safetensors"))
    if not files:
        raise CheckpointError(f"checkpoint {str(root)!r} has no .safetensors weights")
    return files


def checkpoint_files(checkpoint: Checkpoint) -> list[Path]:
    """Every safetensors file of a checkpoint: its own (``weight_files``), then those of an external backbone its
    family names (a checkpoint that ships only what training made; a missing one is a CheckpointError)."""
    return weight_files(checkpoint.path) + checkpoint.family.backbone_weights(checkpoint.path, checkpoint.config)


def scan_weights(checkpoint: Checkpoint) -> dict[str, tuple[str, tuple[int, ...]]]:
    """Name → (safetensors dtype, shape) for every tensor, from the file headers alone."""
    header: dict[str, tuple[str, tuple[int, ...]]] = {}
    for path in checkpoint_files(checkpoint):
        with safe_open(str(path), framework="pt") as handle:
            metadata = handle.metadata() or {}
            if any(key in metadata for key in ("quantization", "quant_method")):
                raise CheckpointError(f"{path.name}: quantized weights are not served (metadata {metadata})")
            for name in handle.keys():
                piece = handle.get_slice(name)
                if name in header:
                    raise CheckpointError(f"tensor {name!r} appears in more than one weight file")
                header[name] = (piece.get_dtype(), tuple(piece.get_shape()))
    return header


def check_weights(checkpoint: Checkpoint, header: dict[str, tuple[str, tuple[int, ...]]]) -> None:
    """Refuse non-BF16 floating tensors and memory tensors that do not match the ``memt`` geometry."""
    for name, (dtype, _) in sorted(header.items()):
        if dtype in ("F8_E4M3", "F8_E5M2", "I8", "U8", "F4", "F6_E2M3", "F6_E3M2", "F8_E8M0"):
            raise CheckpointError(f"tensor {name!r} is {dtype}: quantized weights are not served")
        if dtype.startswith("F") and dtype != "BF16":
            raise CheckpointError(f"tensor {name!r} is {dtype}; weights must be BF16")
    expected = memory_tensor_shapes(checkpoint)
    present = {name for name in header if name.startswith("memt.")}
    missing = sorted(set(expected) - present)
    unexpected = sorted(present - set(expected))
    if missing:
        raise CheckpointError(f"missing memory tensor(s): {', '.join(missing)}")
    if unexpected:
        raise CheckpointError(f"unexpected memory tensor(s) (not in memt.memory_layers geometry): {', '.join(unexpected)}")
    for name, shape in expected.items():
        if header[name][1] != shape:
            raise CheckpointError(
                f"memory tensor {name!r} has shape {list(header[name][1])}, but 'memt' (num_heads, key_dim, "
                f"value_dim) and hidden_size give {list(shape)}"
            )


def build_backbone(checkpoint: Checkpoint) -> torch.nn.Module:
    """A randomly initialised backbone of transformers' own class for this checkpoint, with the kernels its family names."""
    import transformers

    family = checkpoint.family
    config = family.backbone_config(checkpoint.backbone)
    config._attn_implementation = family.attn_implementation
    for kernel in family.kernels:
        resolve(kernel)(config)
    return getattr(transformers, family.backbone_model_class)(config)


def load_model(
    path: str | Path | Checkpoint,
    *,
    device: str | torch.device = "cpu",
    dtype: torch.dtype | None = None,
    lora: str = "merge",
) -> MemTForCausalLM:
    """Load a checkpoint into a ``MemTForCausalLM``; compute dtype defaults to FP32 on CPU, BF16 on GPU.

    A checkpoint's LoRA (``memt_core.models.lora``) is merged into the backbone's weights (``lora="merge"``, serving)
    or kept as trainable peft layers (``lora="train"``, to continue training it)."""
    if lora not in ("merge", "train"):
        raise ValueError(f"lora must be 'merge' or 'train', not {lora!r}")
    checkpoint = path if isinstance(path, Checkpoint) else read_checkpoint(path)
    header = scan_weights(checkpoint)
    check_weights(checkpoint, header)
    lora_config = lora_weights.LoraConfig.from_config(checkpoint.config)
    adapters = lora_weights.pairs(header, lora_config)
    device = torch.device(device)
    if dtype is None:
        dtype = torch.float32 if device.type == "cpu" else torch.bfloat16
    previous = torch.get_default_dtype()
    torch.set_default_dtype(dtype)  # build directly in the compute dtype (no FP32 copy of a large model)
    try:
        with torch.device(device):
            model = MemTForCausalLM(checkpoint, build_backbone(checkpoint))
    finally:
        torch.set_default_dtype(previous)
    if adapters:
        lora_weights.check_shapes(model.backbone, adapters, {name: header[name][1] for pair in adapters.values() for name in pair}, lora_config)
        if lora == "train":
            lora_weights.inject(model.backbone, lora_config, sorted(adapters))
            model.to(device)
    expected = model.checkpoint_state_dict()
    merged = {name for pair in adapters.values() for name in pair} - set(expected)  # read aside, merged below
    missing = sorted(set(expected) - set(header))
    unexpected = sorted(set(header) - set(expected) - merged)
    if missing:
        raise CheckpointError(f"missing tensor(s): {', '.join(missing[:20])}{' …' if len(missing) > 20 else ''}")
    if unexpected:
        raise CheckpointError(f"unexpected tensor(s): {', '.join(unexpected[:20])}{' …' if len(unexpected) > 20 else ''}")
    for name, tensor in expected.items():
        if tuple(tensor.shape) != header[name][1]:
            raise CheckpointError(
                f"tensor {name!r} has shape {list(header[name][1])}; the configuration gives {list(tensor.shape)}"
            )
    from tqdm.auto import tqdm

    # a progress bar on a terminal (tqdm stays silent when stderr is not one, as in logs and tests)
    aside: dict[str, torch.Tensor] = {}
    with torch.no_grad(), tqdm(total=len(expected) + len(merged), desc="loading weights", unit="tensor", disable=None, leave=False) as bar:
        for file in checkpoint_files(checkpoint):
            with safe_open(str(file), framework="pt", device=str(device)) as handle:
                for name in handle.keys():
                    if name in merged:
                        aside[name] = handle.get_tensor(name)
                    else:
                        expected[name].copy_(handle.get_tensor(name))
                    bar.update()
    if merged:
        lora_weights.merge(model.backbone, aside, adapters, lora_config)
    model.eval()
    return model


def save_weights(model: MemTForCausalLM, directory: str | Path, *, max_shard_bytes: int | None = None) -> list[Path]:
    """Write the model's tensors as BF16 safetensors (integer buffers unchanged), sharded with an index if asked.
    A checkpoint with an external backbone (its family's ``backbone_weights``) stores only the other tensors."""
    directory = Path(directory)
    external = set()  # tensors an external backbone holds: the checkpoint names it and stores only the rest
    for file in model.checkpoint.family.backbone_weights(model.checkpoint.path, model.checkpoint.config):
        with safe_open(str(file), framework="pt") as handle:
            external.update(handle.keys())
    tensors = {}
    for name, t in model.checkpoint_state_dict().items():
        if name in external:
            continue
        t = (t.detach().to("cpu", torch.bfloat16) if t.is_floating_point() else t.detach().cpu()).contiguous()
        # a parameter may be a view of a tensor it shares with others (the fused decode step's weights): its own copy
        tensors[name] = t.clone() if t.untyped_storage().nbytes() != t.numel() * t.element_size() else t
    if not max_shard_bytes:
        save_file(tensors, str(directory / SINGLE_FILE), metadata={"format": "pt"})
        return [directory / SINGLE_FILE]
    shards: list[dict[str, torch.Tensor]] = [{}]
    size = 0
    for name, tensor in tensors.items():
        nbytes = tensor.numel() * tensor.element_size()
        if shards[-1] and size + nbytes > max_shard_bytes:
            shards.append({})
            size = 0
        shards[-1][name] = tensor
        size += nbytes
    paths, weight_map = [], {}
    for number, shard in enumerate(shards, start=1):
        file = f"model-{number:05d}-of-{len(shards):05d}.safetensors"
        save_file(shard, str(directory / file), metadata={"format": "pt"})
        weight_map.update({name: file for name in shard})
        paths.append(directory / file)
    total = sum(t.numel() * t.element_size() for t in tensors.values())
    (directory / INDEX_FILE).write_text(json.dumps({"metadata": {"total_size": total}, "weight_map": weight_map}, indent=2))
    return paths
