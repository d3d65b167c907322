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


def make_tiny_checkpoint(
    directory: str | Path,
    family: str | Family = families.DEFAULT,
    *,
    seed: int = 0,
    chunk_tokens: int = 32,
    max_shard_bytes: int | None = None,
) -> Path:
    """Write a complete random tiny checkpoint of ``family`` (a registered name, e.g. "memt-nano") into ``directory``."""
    from memt_core.models.memt import MemTForCausalLM
    from memt_core.models.weights import build_backbone, save_weights

    family = _family(family)
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    tokenizer = build_tokenizer(directory, family)
    config = family.tiny_config(tokenizer, chunk_tokens=chunk_tokens)
    (directory / "config.json").write_text(json.dumps(config, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
    checkpoint = read_checkpoint(directory)
    torch.manual_seed(seed)
    model = MemTForCausalLM(checkpoint, build_backbone(checkpoint))
    with torch.no_grad():
        for name, param in model.backbone.named_parameters():
            if not torch.isfinite(param).all() or name.endswith("sinks"):
                param.normal_(0.0, 0.2)  # parameters the backbone leaves uninitialised
        for layer in model.memory_layers:
            model.memory_module(layer).reset_parameters(std=0.3)
    save_weights(model, directory, max_shard_bytes=max_shard_bytes)
    return directory

