"""Tiny MemT checkpoints of both families, written in seconds, for tests and examples.

Each is a complete checkpoint directory: ``config.json``, BF16 safetensors (optionally sharded with
an index), a byte-level BPE tokenizer in Hugging Face format, and the family's prompt format — the
Nano chat template, or the Flash ``encoding_dsv4.py``. Weights are random; nothing here is trained.
"""

from __future__ import annotations

import json
import shutil
from importlib import resources
from pathlib import Path
from typing import Iterable

import torch

from memt_core.checkpoint import FLASH, NANO, read_checkpoint

NANO_SPECIAL_TOKENS = [
    "<|endoftext|>", "<|im_start|>", "<|im_end|>", "<think>", "</think>",
    "<tool_call>", "</tool_call>", "<tool_response>", "</tool_response>",
]
FLASH_SPECIAL_TOKENS = [
    "<｜begin▁of▁sentence｜>", "<｜end▁of▁sentence｜>", "<｜User｜>", "<｜Assistant｜>", "<think>", "</think>",
]

# A small corpus so the tokenizer learns a few English merges; the rest is byte fallback.
CORPUS = [
    "The quick brown fox jumps over the lazy dog. I have a kitten named Memmy who loves small shrimp.",
    "What is the weather in Paris today? It is sunny and warm. Please remember my name and my city.",
    "User: hello there, how are you? Assistant: I am fine, thank you. Tell me about your day.",
    "The document describes a library of books, a river, a mountain, and a small town by the sea.",
    '{"name": "get_weather", "arguments": {"city": "Paris"}} tool call result temperature 21 degrees',
    "Numbers 0 1 2 3 4 5 6 7 8 9 10 100 1000. Questions and answers about memory and models.",
]


def template_text(name: str) -> str:
    """A file from ``memt_core/templates`` (the Nano chat template, the Flash encoder)."""
    return resources.files("memt_core.templates").joinpath(name).read_text(encoding="utf-8")


def build_tokenizer(
    directory: str | Path,
    family: str,
    *,
    corpus: Iterable[str] = CORPUS,
    vocab_size: int = 512,
    extra_special_tokens: Iterable[str] = (),
):
    """Train a byte-level BPE on ``corpus`` and save it (with the family's prompt format) in HF format."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    special = list(NANO_SPECIAL_TOKENS if family == NANO else FLASH_SPECIAL_TOKENS) + list(extra_special_tokens)
    backend = Tokenizer(models.BPE())
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    backend.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=special,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    backend.train_from_iterator(list(corpus), trainer)
    if family == NANO:
        tokenizer = PreTrainedTokenizerFast(
            tokenizer_object=backend, eos_token="<|im_end|>", pad_token="<|endoftext|>", unk_token=None
        )
        tokenizer.chat_template = template_text("nano_chat_template.jinja")
    else:
        tokenizer = PreTrainedTokenizerFast(
            tokenizer_object=backend,
            bos_token="<｜begin▁of▁sentence｜>",
            eos_token="<｜end▁of▁sentence｜>",
            pad_token="<｜end▁of▁sentence｜>",
        )
    tokenizer.save_pretrained(str(directory))
    if family == FLASH:
        shutil.copyfile(resources.files("memt_core.templates").joinpath("encoding_dsv4.py"), directory / "encoding_dsv4.py")
    return tokenizer


def nano_config(vocab_size: int, eos_token_id: int, pad_token_id: int, *, hidden_size: int = 64, chunk_tokens: int = 32) -> dict:
    """config.json of a tiny Nano: 4 layers (linear, full, linear, full), memory on the full-attention layers."""
    return {
        "model_type": "memt_qwen3_5_moe",
        "architectures": ["MemTQwen3_5MoeForCausalLM"],
        "memt_checkpoint_id": "tiny-random-nano",
        "dtype": "bfloat16",
        "backbone_configs": {
            "model_type": "qwen3_5_moe",
            "text_config": {
                "vocab_size": vocab_size,
                "hidden_size": hidden_size,
                "num_hidden_layers": 4,
                "layer_types": ["linear_attention", "full_attention", "linear_attention", "full_attention"],
                "num_attention_heads": 4,
                "num_key_value_heads": 2,
                "head_dim": 16,
                "linear_num_key_heads": 2,
                "linear_num_value_heads": 4,
                "linear_key_head_dim": 16,
                "linear_value_head_dim": 16,
                "num_experts": 4,
                "num_experts_per_tok": 2,
                "moe_intermediate_size": 32,
                "shared_expert_intermediate_size": 32,
                "max_position_embeddings": 8192,
                "initializer_range": 0.2,
                "eos_token_id": eos_token_id,
                "pad_token_id": pad_token_id,
            },
        },
        "memt": {
            "chunk_tokens": chunk_tokens,
            "memory_layers": [1, 3],
            "num_heads": 2,
            "key_dim": 16,
            "value_dim": 16,
            "update_rule": "gated_delta",
            "state_dtype": "float32",
        },
        "memt_runtime": {"max_sessions_per_rank": 64, "max_inflight_commits_per_rank": 4, "min_kv_tokens": 256},
    }


def flash_config(vocab_size: int, eos_token_id: int, bos_token_id: int, *, hidden_size: int = 64, chunk_tokens: int = 32) -> dict:
    """config.json of a tiny Flash: a flat DeepSeek-V4 config with two attention layers, both with memory."""
    return {
        "model_type": "memt_deepseek_v4",
        "architectures": ["MemTDeepseekV4ForCausalLM"],
        "memt_checkpoint_id": "tiny-random-flash",
        "dtype": "bfloat16",
        "vocab_size": vocab_size,
        "hidden_size": hidden_size,
        "num_hidden_layers": 2,
        "layer_types": ["sliding_attention", "compressed_sparse_attention"],
        "mlp_layer_types": ["hash_moe", "moe"],
        "num_attention_heads": 4,
        "head_dim": 32,
        "q_lora_rank": 32,
        "o_groups": 2,
        "o_lora_rank": 16,
        "moe_intermediate_size": 32,
        "n_routed_experts": 4,
        "num_experts_per_tok": 2,
        "index_n_heads": 2,
        "index_head_dim": 16,
        "index_topk": 4,
        "sliding_window": 64,
        "hc_mult": 2,
        "max_position_embeddings": 8192,
        "initializer_range": 0.2,
        "bos_token_id": bos_token_id,
        "eos_token_id": eos_token_id,
        "memt": {
            "chunk_tokens": chunk_tokens,
            "memory_layers": [0, 1],
            "num_heads": 2,
            "key_dim": 16,
            "value_dim": 16,
            "update_rule": "gated_delta",
            "state_dtype": "float32",
        },
        "memt_runtime": {"max_sessions_per_rank": 64, "max_inflight_commits_per_rank": 4, "min_kv_tokens": 256},
    }


def make_tiny_checkpoint(
    directory: str | Path,
    family: str = NANO,
    *,
    seed: int = 0,
    chunk_tokens: int = 32,
    max_shard_bytes: int | None = None,
) -> Path:
    """Write a complete random tiny checkpoint of ``family`` ("memt-nano" or "memt-flash") into ``directory``."""
    from memt_core.models.memt import MemTForCausalLM
    from memt_core.models.weights import build_backbone, save_weights

    if family not in (NANO, FLASH):
        raise ValueError(f"family must be {NANO!r} or {FLASH!r}")
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    tokenizer = build_tokenizer(directory, family)
    vocab = len(tokenizer)
    if family == NANO:
        config = nano_config(vocab, tokenizer.convert_tokens_to_ids("<|im_end|>"), tokenizer.pad_token_id, chunk_tokens=chunk_tokens)
    else:
        config = flash_config(vocab, tokenizer.eos_token_id, tokenizer.bos_token_id, chunk_tokens=chunk_tokens)
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
