"""``Family``: everything that differs between MemT model families, as one object per family.

A family says how its ``config.json`` holds the backbone, which transformers classes build it, where
the memory modules sit in it, how prompts are encoded and outputs parsed, how its tokenizer loads
and what a tiny random checkpoint of it looks like. Code outside :mod:`memt_core.families` asks a
family object and never branches on a family's name.

Families are the floor: they import nothing of memt_core above them (no client, models or checkpoint
code, not even inside functions). The classes and functions of other layers a family uses (chat format,
parser, kernels) are named as ``"module:name"`` strings, which those layers resolve with ``resolve``.
"""

from __future__ import annotations

import hashlib
import importlib
from pathlib import Path

from memt_core.errors import CheckpointError

#: Top-level keys of config.json that belong to MemT, not to any backbone.
MEMT_KEYS = ("memt", "memt_runtime", "memt_checkpoint_id", "memt_backbone", "memt_lora")


class Family:
    """One model family. Subclasses set the class attributes and override what their format needs."""

    name: str  # public model name, reported as "model" (e.g. in /memt/identity)
    model_type: str  # config.json's top-level model_type that selects this family
    architecture: str  # the one accepted entry of config.json's "architectures"
    backbone_type: str  # model_type of the backbone as transformers knows it
    backbone_config_class: str  # transformers config class of the backbone
    backbone_model_class: str  # transformers causal-LM class of the backbone
    attn_implementation: str = "sdpa"  # transformers attention implementation the backbone runs with
    native_attention: frozenset[str] = frozenset()  # backbone layer types a memory module may sit beside
    attention_path: str = "model.layers.{layer}.self_attn"  # the attention module of a backbone layer
    encoding: str  # name of the native prompt encoding, part of the snapshot identity
    takes_encoder: bool = False  # prompts come from an encoder script a client may name explicitly
    special_tokens: tuple[str, ...] = ()  # special tokens of a tiny checkpoint's tokenizer
    tokenizer_type: str | None = None  # the name documented for AutoTokenizer.from_pretrained(tokenizer_type=...)
    chat_format_class: str  # "module:Class" of the client's prompt encoder, built as Class(path, tokenizer, kwargs[, encoder_path=])
    parser_class: str  # "module:Class" of the client's output parser, built as Class(family name)
    #: "module:function"s the model code calls with the backbone's transformers config before building it.
    kernels: tuple[str, ...] = ("memt_core.models.kernels:use_experts",)
    #: "module:Class" of a decode step in fewer kernel launches than the backbone's own modules (``Class(model)``,
    #: ``Class.supports(model)``; see ``memt_core.models.decode``), or None: the engine decodes with the model.
    decode_step: str | None = None
    #: "module:function" saying how each checkpoint tensor is split over ranks (``split(name) -> (kind, dim) | None``,
    #: see ``memt_core.parallel.plan``): the sharded loader reads each rank's slices by it, ``--dry-run`` sizes the
    #: ranks' shares by it. None: the family is served on one rank only.
    tensor_split: str | None = None
    #: Named width presets of random checkpoints besides the tiny one (``widths_config``), e.g. "nano".
    widths: tuple[str, ...] = ()
    #: Parallel serving (``memt_core.parallel``): whether the family is served with ``--enable-dp-attention`` (the
    #: seed: Flash yes, Nano no), and whether its attention can be split over ranks (attention TP above 1).
    dp_attention: bool = False
    shards_attention: bool = True

    def __repr__(self) -> str:
        return f"<family {self.name} ({self.model_type})>"

    # ------------------------------------------------------------------ config.json

    def backbone(self, config: dict) -> dict:
        """The backbone's configuration as transformers reads it, taken out of a validated config.json."""
        raise NotImplementedError

    def nested_backbone(self, config: dict) -> dict:
        """config.json's ``backbone_configs`` (a family that nests its backbone), checked: an object of this family's
        ``backbone_type``, unquantized."""
        nested = config.get("backbone_configs")
        if nested is None:
            raise CheckpointError(f"config.json: {self.model_type} requires 'backbone_configs'")
        if not isinstance(nested, dict):
            raise CheckpointError("config.json: 'backbone_configs' must be an object")
        if nested.get("model_type") != self.backbone_type:
            raise CheckpointError(
                f"config.json: 'backbone_configs.model_type' must be {self.backbone_type!r}, got {nested.get('model_type')!r}"
            )
        refuse_quantized(nested, "backbone_configs.")
        return nested

    def backbone_config(self, backbone: dict):
        """The transformers config object of the backbone; a field transformers refuses is a CheckpointError."""
        import transformers
        from huggingface_hub.errors import StrictDataclassFieldValidationError

        config_class = getattr(transformers, self.backbone_config_class)
        fields = {k: v for k, v in backbone.items() if k not in ("model_type", "architectures")}
        try:
            return config_class(**fields)
        except (StrictDataclassFieldValidationError, TypeError, ValueError) as exc:
            raise CheckpointError(f"config.json: invalid backbone configuration: {exc}") from exc

    def layer_types(self, config) -> list[str]:
        """The type of each backbone layer, from its transformers config (``native_attention`` names the types a
        memory module may sit beside)."""
        return list(config.layer_types)

    # ------------------------------------------------------------------ weights

    def backbone_weights(self, root: Path, config: dict) -> list[Path]:
        """Safetensors files outside the checkpoint directory that hold its backbone (a checkpoint that ships only
        what training made names them in its config.json); a missing or different file is a CheckpointError that
        says how to get it. None by default: every tensor is in the checkpoint directory."""
        return []

    def weights_identity(self, config: dict) -> str | None:
        """A digest of weights the checkpoint directory does not hold (its external backbone), which enters the
        snapshot identity: memory written on one backbone means nothing on another. None when it has none."""
        return None

    # ------------------------------------------------------------------ model

    def attention(self, backbone, layer: int):
        """The native attention module of backbone layer ``layer``: the memory module's neighbour."""
        return backbone.get_submodule(self.attention_path.format(layer=layer))

    # ------------------------------------------------------------------ prompts and outputs

    def native_encoding(self, root: Path) -> dict:
        """How prompts become tokens, as it enters the snapshot identity."""
        return {"name": self.encoding}

    def encoder(self, root: Path, named: str | Path | None = None) -> Path | None:
        """The prompt encoder script a client executes (``takes_encoder`` families): ``named``, else the checkpoint's."""
        return Path(named) if named is not None else None

    # ------------------------------------------------------------------ tiny random checkpoints

    def tiny_tokenizer(self, backend):
        """Wrap a trained ``tokenizers.Tokenizer`` as this family's HF tokenizer (special tokens, template)."""
        raise NotImplementedError

    def write_prompt_files(self, directory: Path) -> None:
        """Files besides the tokenizer's that a tiny checkpoint needs for its prompt format."""

    def tiny_config(self, tokenizer, *, hidden_size: int = 64, chunk_tokens: int = 32) -> dict:
        """config.json of a tiny random checkpoint for ``tokenizer``."""
        raise NotImplementedError

    def widths_config(self, tokenizer, widths: str, *, layers: int | None = None, experts: int | None = None,
                      chunk_tokens: int = 2048) -> dict:
        """config.json of a random checkpoint at the named widths (one of ``widths``): a released model's layer
        and head sizes, with fewer layers and experts, for benches of what those sizes cost."""
        raise ValueError(f"{self.name} has no {widths!r} widths; it has {', '.join(self.widths) or 'only the tiny ones'}")

    def tiny_header(self) -> dict:
        """The top-level keys a tiny config.json starts with: what selects the family, an id, BF16."""
        return {
            "model_type": self.model_type,
            "architectures": [self.architecture],
            "memt_checkpoint_id": f"tiny-random-{self.name.removeprefix('memt-')}",
            "dtype": "bfloat16",
        }


def refuse_quantized(config: dict, prefix: str = "") -> None:
    """Only unquantized BF16 weights are served: refuse a quantization config or another dtype."""
    if config.get("quantization_config") is not None:
        raise CheckpointError(f"config.json: '{prefix}quantization_config' is set; only unquantized BF16 weights are served")
    for key in ("torch_dtype", "dtype"):
        value = config.get(key)
        if value is not None and value != "bfloat16":
            raise CheckpointError(f"config.json: '{prefix}{key}' is {value!r}; weights must be bfloat16")


def tiny_memory(memory_layers: list[int], chunk_tokens: int, *, heads: int = 2, key_dim: int = 16, value_dim: int = 16) -> dict:
    """The ``memt`` and ``memt_runtime`` objects of a tiny checkpoint: 2 heads of 16×16 per memory layer unless told."""
    return {
        "memt": {
            "chunk_tokens": chunk_tokens,
            "memory_layers": list(memory_layers),
            "num_heads": heads,
            "key_dim": key_dim,
            "value_dim": value_dim,
            "update_rule": "gated_delta",
            "state_dtype": "float32",
        },
        "memt_runtime": {"max_sessions_per_rank": 64, "max_inflight_commits_per_rank": 4, "min_kv_tokens": 256},
    }


def sha256_file(path: Path) -> str:
    """Hex SHA-256 of a file's bytes."""
    return hashlib.sha256(path.read_bytes()).hexdigest()


def resolve(reference: str):
    """The object a family names as ``"module:name"`` (importing that module now, in the caller's layer)."""
    module, sep, name = reference.partition(":")
    if not (module and sep and name):
        raise ValueError(f"{reference!r} is not a 'module:name' reference")
    return getattr(importlib.import_module(module), name)
