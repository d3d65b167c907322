"""Tiny MemT checkpoints of any registered family, written in seconds, for tests and examples.

Each is a complete checkpoint directory: ``config.json``, BF16 safetensors (optionally sharded with
an index), a byte-level BPE tokenizer in Hugging Face format, and the family's prompt format (e.g.
the Nano chat template, the Flash ``encoding_dsv4.py``). What differs per family — special tokens,
config.json, prompt files — comes from its :class:`~memt_core.families.Family`. Weights are
random; nothing here is trained.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Iterable

import torch

from memt_core import families
from memt_core.checkpoint import read_checkpoint
from memt_core.families import Family
from memt_core.templates import template_text  # noqa: F401 (re-exported: its old home)

# A small corpus so the tokenizer learns a few English merges; the rest is byte fallback.
CORPUS = [
    "The quick brown fox jumps over the lazy dog. I have a kitten named Memmy who loves small shrimp.",
    "What is the weather in Paris today? It is sunny and warm. Please remember my name and my city.",
    "User: hello there, how are you? Assistant: I am fine, thank you. Tell me about your day.",
    "The document describes a library of books, a river, a mountain, and a small town by the sea.",
    '{"name": "get_weather", "arguments": {"city": "Paris"}} tool call result temperature 21 degrees',
    "Numbers 0 1 2 3 4 5 6 7 8 9 10 100 1000. Questions and answers about memory and models.",
]


def _family(family: str | Family) -> Family:
    return family if isinstance(family, Family) else families.get(family)


def build_tokenizer(
    directory: str | Path,
    family: str | Family,
    *,
    corpus: Iterable[str] = CORPUS,
    vocab_size: int = 512,
    extra_special_tokens: Iterable[str] = (),
):
    """Train a byte-level BPE on ``corpus`` and save it (with the family's prompt format) in HF format."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    family = _family(family)
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    backend = Tokenizer(models.BPE())
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    backend.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=list(family.special_tokens) + list(extra_special_tokens),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    backend.train_from_iterator(list(corpus), trainer)
    tokenizer = family.tiny_tokenizer(backend)
    tokenizer.save_pretrained(str(directory))
    family.write_prompt_files(directory)
    return tokenizer


def write_config(
    directory: str | Path,
    family: str | Family = families.DEFAULT,
    *,
    chunk_tokens: int = 32,
    widths: str | None = None,
    layers: int | None = None,
    experts: int | None = None,
) -> Path:
    """Write a checkpoint's tokenizer, prompt files and ``config.json`` (no weights): the tiny widths, or the
    family's named ``widths`` (e.g. "nano": the released model's, with ``layers`` layers and ``experts`` experts)."""
    family = _family(family)
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    tokenizer = build_tokenizer(directory, family)
    if widths in (None, "tiny"):
        if layers is not None or experts is not None:
            raise ValueError("layers and experts are set by the tiny widths; name other widths (e.g. 'nano') to choose them")
        config = family.tiny_config(tokenizer, chunk_tokens=chunk_tokens)
    else:
        config = family.widths_config(tokenizer, widths, layers=layers, experts=experts, chunk_tokens=chunk_tokens)
    (directory / "config.json").write_text(json.dumps(config, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
    return directory


def random_model(checkpoint, *, seed: int = 0, dtype: torch.dtype | None = None, device: str | torch.device = "cpu"):
    """A ``MemTForCausalLM`` of ``checkpoint``'s configuration with random weights (``seed``), in ``dtype`` (FP32
    unless told) on ``device``: what ``make_tiny_checkpoint`` saves, or a model for a bench that needs no files."""
    from memt_core.models.memt import MemTForCausalLM
    from memt_core.models.weights import build_backbone

    if not hasattr(checkpoint, "memory"):
        checkpoint = read_checkpoint(checkpoint)
    std = float(checkpoint.backbone.get("initializer_range", 0.2))
    torch.manual_seed(seed)
    previous = torch.get_default_dtype()
    torch.set_default_dtype(dtype or torch.float32)
    try:
        with torch.device(device):
            model = MemTForCausalLM(checkpoint, build_backbone(checkpoint))
    finally:
        torch.set_default_dtype(previous)
    with torch.no_grad():
        for name, param in model.backbone.named_parameters():
            if not torch.isfinite(param).all() or name.endswith("sinks"):
                param.normal_(0.0, std)  # parameters the backbone leaves uninitialised
        # 0.3 at the tiny widths (hidden 64); wider models get proportionally smaller projections
        memory_std = 0.3 * min(1.0, (64 / checkpoint.hidden_size) ** 0.5)
        for layer in model.memory_layers:
            model.memory_module(layer).reset_parameters(std=memory_std)
    return model.eval()


def make_tiny_checkpoint(
    directory: str | Path,
    family: str | Family = families.DEFAULT,
    *,
    seed: int = 0,
    chunk_tokens: int = 32,
    max_shard_bytes: int | None = None,
    widths: str | None = None,
    layers: int | None = None,
    experts: int | None = None,
) -> Path:
    """Write a complete random checkpoint of ``family`` (a registered name, e.g. "memt-nano") into ``directory``:
    tiny, or at the family's named ``widths`` (see ``write_config``)."""
    from memt_core.models.weights import save_weights

    directory = write_config(directory, family, chunk_tokens=chunk_tokens, widths=widths, layers=layers, experts=experts)
    model = random_model(read_checkpoint(directory), seed=seed)
    save_weights(model, directory, max_shard_bytes=max_shard_bytes)
    return directory
