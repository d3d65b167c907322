"""MemT-1.0-Nano: a Qwen3.5-MoE backbone, prompts through the checkpoint's Hugging Face chat template.

config.json nests the backbone as ``backbone_configs`` (``model_type: qwen3_5_moe``) with its
``text_config``; memory modules sit beside the ``full_attention`` layers (the others are linear
attention). Outputs are ChatML: ``<think>…</think>`` reasoning and ``<tool_call>`` JSON calls.
"""

from __future__ import annotations

from memt_core.errors import CheckpointError
from memt_core.families.base import Family, refuse_quantized, tiny_memory

#: The released MemT-1.0-Nano's widths (its Qwen3.6-35B-A3B text model): hidden 2048; 16 query and 2 KV heads
#: of 256; linear attention 16 key and 32 value heads of 128 (a causal convolution of 4); top-8 experts 512 wide
#: plus a shared expert of 512. Layers repeat three linear-attention layers, then one full-attention layer.
NANO_WIDTHS = {
    "hidden_size": 2048,
    "num_attention_heads": 16,
    "num_key_value_heads": 2,
    "head_dim": 256,
    "linear_num_key_heads": 16,
    "linear_num_value_heads": 32,
    "linear_key_head_dim": 128,
    "linear_value_head_dim": 128,
    "linear_conv_kernel_dim": 4,
    "num_experts_per_tok": 8,
    "moe_intermediate_size": 512,
    "shared_expert_intermediate_size": 512,
}
#: Its memory: 16 heads of 128 × 128 beside every full-attention layer.
NANO_MEMORY = {"heads": 16, "key_dim": 128, "value_dim": 128}
#: Every fourth layer is full attention (layers 3, 7, …), as in the released model.
FULL_ATTENTION_EVERY = 4


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
    decode_step = "memt_core.models.decode:FusedDecode"
    tensor_split = "memt_core.parallel.plan:split_of"  # the Qwen3.5-MoE rules, as SGLang and vLLM split it
    widths = ("nano",)
    special_tokens = (
        "<|endoftext|>", "<|im_start|>", "<|im_end|>", "<think>", "</think>",
        "<tool_call>", "</tool_call>", "<tool_response>", "</tool_response>",
    )

    def backbone(self, config: dict) -> dict:
        text = self.nested_backbone(config).get("text_config")
        if not isinstance(text, dict):
            raise CheckpointError("config.json: 'backbone_configs.text_config' must be an object")
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

    def widths_config(self, tokenizer, widths: str, *, layers: int | None = None, experts: int | None = None,
                      chunk_tokens: int = 2048) -> dict:
        """The released model's widths (``NANO_WIDTHS``, ``NANO_MEMORY``) with ``layers`` layers (a multiple of 4,
        default 4: three linear, then one full) and ``experts`` routed experts (default 32; 256 released)."""
        if widths not in self.widths:
            return super().widths_config(tokenizer, widths, layers=layers, experts=experts, chunk_tokens=chunk_tokens)
        layers = FULL_ATTENTION_EVERY if layers is None else layers
        experts = 32 if experts is None else experts
        if layers < FULL_ATTENTION_EVERY or layers % FULL_ATTENTION_EVERY:
            raise ValueError(f"--layers must be a positive multiple of {FULL_ATTENTION_EVERY} (three linear-attention "
                             f"layers, then one full-attention layer, which carries the memory), got {layers}")
        if experts < NANO_WIDTHS["num_experts_per_tok"]:
            raise ValueError(f"--experts must be at least the {NANO_WIDTHS['num_experts_per_tok']} each token is routed to, got {experts}")
        layer_types = ["full_attention" if (i + 1) % FULL_ATTENTION_EVERY == 0 else "linear_attention" for i in range(layers)]
        header = self.tiny_header()
        header["memt_checkpoint_id"] = f"random-{self.name.removeprefix('memt-')}-{widths}-widths-{layers}l-{experts}e"
        return {
            **header,
            "backbone_configs": {
                "model_type": self.backbone_type,
                "text_config": {
                    "vocab_size": len(tokenizer),
                    **NANO_WIDTHS,
                    "num_hidden_layers": layers,
                    "layer_types": layer_types,
                    "num_experts": experts,
                    "max_position_embeddings": 32768,
                    "initializer_range": 0.02,
                    "eos_token_id": tokenizer.convert_tokens_to_ids("<|im_end|>"),
                    "pad_token_id": tokenizer.pad_token_id,
                },
            },
            **tiny_memory([i for i, kind in enumerate(layer_types) if kind == "full_attention"], chunk_tokens, **NANO_MEMORY),
        }
