"""MemT-1.0-Nano: a Qwen3.5-MoE backbone, prompts through the checkpoint's Hugging Face chat template.

config.json nests the backbone as ``backbone_configs`` (``model_type: qwen3_5_moe``) with its
``text_config``; memory modules sit beside the ``full_attention`` layers (the others are linear
attention). Outputs are ChatML: ``<think>…</think>`` reasoning and ``<tool_call>`` JSON calls.
"""

from __future__ import annotations

from memt_core.errors import CheckpointError
from memt_core.families.base import Family, refuse_quantized, tiny_memory


class Nano(Family):
    """MemT-1.0-Nano (Qwen3.6-35B-A3B backbone): nested backbone config, memory beside full attention."""

    name = "memt-nano"
    model_type = "memt_qwen3_5_moe"
    architecture = "MemTQwen3_5MoeForCausalLM"
    backbone_type = "qwen3_5_moe"
    backbone_config_class = "Qwen3_5MoeTextConfig"
    backbone_model_class = "Qwen3_5MoeForCausalLM"
    attn_implementation = "sdpa"
    native_attention = frozenset({"full_attention"})
    encoding = "hf-chat-template"
    chat_format_class = "memt_core.client.chat_format:NanoChatFormat"
    parser_class = "memt_core.client.parsers:NanoParser"
    kernels = ("memt_core.models.kernels:route_qwen3_5_moe", *Family.kernels)  # FLA / causal-conv1d kernels for CUDA tensors only
    special_tokens = (
        "<|endoftext|>", "<|im_start|>", "<|im_end|>", "<think>", "</think>",
        "<tool_call>", "</tool_call>", "<tool_response>", "</tool_response>",
    )

    def backbone(self, config: dict) -> dict:
        nested = config.get("backbone_configs")
        if nested is None:
            raise CheckpointError(f"config.json: {self.model_type} requires 'backbone_configs'")
        if not isinstance(nested, dict):
            raise CheckpointError("config.json: 'backbone_configs' must be an object")
        if nested.get("model_type") != self.backbone_type:
            raise CheckpointError(
                f"config.json: 'backbone_configs.model_type' must be {self.backbone_type!r}, got {nested.get('model_type')!r}"
            )
        text = nested.get("text_config")
        if not isinstance(text, dict):
            raise CheckpointError("config.json: 'backbone_configs.text_config' must be an object")
        refuse_quantized(nested, "backbone_configs.")
        refuse_quantized(text, "backbone_configs.text_config.")
        return dict(text)

    def tiny_tokenizer(self, backend):
        from transformers import PreTrainedTokenizerFast

        from memt_core.templates import template_text

        tokenizer = PreTrainedTokenizerFast(
            tokenizer_object=backend, eos_token="<|im_end|>", pad_token="<|endoftext|>", unk_token=None
        )
        tokenizer.chat_template = template_text("nano_chat_template.jinja")
        return tokenizer

    def tiny_config(self, tokenizer, *, hidden_size: int = 64, chunk_tokens: int = 32) -> dict:
        """4 layers (linear, full, linear, full), memory on the two full-attention layers."""
        return {
            **self.tiny_header(),
            "backbone_configs": {
                "model_type": self.backbone_type,
                "text_config": {
                    "vocab_size": len(tokenizer),
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
                    "eos_token_id": tokenizer.convert_tokens_to_ids("<|im_end|>"),
                    "pad_token_id": tokenizer.pad_token_id,
                },
            },
            **tiny_memory([1, 3], chunk_tokens),
        }

