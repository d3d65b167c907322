"""MemT-1.0-Flash: a DeepSeek-V4 backbone, prompts through the checkpoint's ``encoding_dsv4.py``.

config.json is the flat DeepSeek-V4 configuration plus MemT's own keys, and holds no
``backbone_configs``. Every attention layer type of DeepSeek-V4 is native attention, so memory may
sit beside any layer. The encoder script is executed by clients only, never by the server; its
SHA-256 is part of the snapshot identity.
"""

from __future__ import annotations

import shutil
from importlib import resources
from pathlib import Path

from memt_core.errors import CheckpointError
from memt_core.families.base import MEMT_KEYS, Family, sha256_file, tiny_memory

#: Where a Flash checkpoint keeps its prompt encoder, in order of preference.
ENCODER_FILES = ("encoding_dsv4.py", "encoding/encoding_dsv4.py")


class Flash(Family):
    """MemT-1.0-Flash (DeepSeek-V4-Flash backbone): flat config, prompts from the encoder script."""

    name = "memt-flash"
    model_type = "memt_deepseek_v4"
    architecture = "MemTDeepseekV4ForCausalLM"
    backbone_type = "deepseek_v4"
    backbone_config_class = "DeepseekV4Config"
    backbone_model_class = "DeepseekV4ForCausalLM"
    attn_implementation = "eager"  # transformers offers no SDPA path for DeepSeek-V4
    native_attention = frozenset({"sliding_attention", "compressed_sparse_attention", "heavily_compressed_attention"})
    encoding = "encoding_dsv4"
    tokenizer_type = "deepseek_v4"  # the spec tells Flash users to pass it; transformers does not know it by itself
    takes_encoder = True
    chat_format_class = "memt_core.client.chat_format:FlashChatFormat"
    parser_class = "memt_core.client.parsers:FlashParser"
    dp_attention = True  # the seed serves Flash at TP 8 with DP attention 8: attention TP 1, experts shared
    shards_attention = False  # its attention (DeepSeek-V4's) is not split: attention TP stays 1
    tensor_split = "memt_core.parallel.plan:split_of"  # the same rules for its experts, lm_head and memory
    special_tokens = (
        "<｜begin▁of▁sentence｜>", "<｜end▁of▁sentence｜>", "<｜User｜>", "<｜Assistant｜>", "<think>", "</think>",
    )

    def backbone(self, config: dict) -> dict:
        if "backbone_configs" in config:
            raise CheckpointError(f"config.json: {self.model_type} must not contain 'backbone_configs'")
        backbone = {k: v for k, v in config.items() if k not in MEMT_KEYS and k != "architectures"}
        backbone["model_type"] = self.backbone_type
        return backbone

    def native_encoding(self, root: Path) -> dict:
        encoder = find_encoder(root)
        return {"name": self.encoding, "sha256": sha256_file(encoder) if encoder else None}

    def encoder(self, root, named=None):
        if named is not None:
            return Path(named)
        encoder = find_encoder(Path(root))
        if encoder is None:
            raise FileNotFoundError(f"{root} has no encoding_dsv4.py; pass its location as deepseek_encoder")
        return encoder

    def tiny_tokenizer(self, backend):
        from transformers import PreTrainedTokenizerFast

        return PreTrainedTokenizerFast(
            tokenizer_object=backend,
            bos_token="<｜begin▁of▁sentence｜>",
            eos_token="<｜end▁of▁sentence｜>",
            pad_token="<｜end▁of▁sentence｜>",
        )

    def write_prompt_files(self, directory: Path) -> None:
        shutil.copyfile(resources.files("memt_core.templates").joinpath("encoding_dsv4.py"), directory / ENCODER_FILES[0])

    def tiny_config(self, tokenizer, *, hidden_size: int = 64, chunk_tokens: int = 32) -> dict:
        """A flat DeepSeek-V4 config with two attention layers (sliding window 64), both with memory."""
        return {
            **self.tiny_header(),
            "vocab_size": len(tokenizer),
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
            "bos_token_id": tokenizer.bos_token_id,
            "eos_token_id": tokenizer.eos_token_id,
            **tiny_memory([0, 1], chunk_tokens),
        }


def find_encoder(root: Path) -> Path | None:
    """The checkpoint's ``encoding_dsv4.py``, or None."""
    for name in ENCODER_FILES:
        if (root / name).is_file():
            return root / name
    return None
