"""MemT checkpoint directories: which model, its memory fields, runtime limits and identities.

A checkpoint is a local directory with ``config.json``, BF16 safetensors and tokenizer files. The
top-level ``model_type`` selects the family (:mod:`memt_core.families`), which reads the backbone's
part; this module checks what all families share. Validation pins only the fields that choose the
algorithm and the BF16 serving path: keys of ``memt`` / ``memt_runtime`` it does not know are kept
(``Checkpoint.extra``) and reported (``Checkpoint.unknown_keys``), not refused. Nothing in the
directory is ever executed here. No torch or transformers at import time, so the client can use it.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any, Mapping

from memt_core import families
from memt_core.errors import CheckpointError
from memt_core.families.base import Family, refuse_quantized

#: Prefix of memory-module tensors in the safetensors files; backbone tensors keep their own names.
MEMORY_PREFIX = "memt.layers."

SNAPSHOT_FORMAT = "memt-memory-v1"

#: The fields of ``memt`` this code reads; others are kept and reported.
MEMORY_FIELDS = ("chunk_tokens", "memory_layers", "num_heads", "key_dim", "value_dim", "update_rule", "state_dtype")


@dataclass(frozen=True)
class MemoryConfig:
    """The checkpoint's ``memt`` object: the memory geometry and the algorithm it selects."""

    chunk_tokens: int  # tokens per write event
    memory_layers: tuple[int, ...]  # backbone layers that carry a memory module
    num_heads: int  # H
    key_dim: int  # K
    value_dim: int  # V
    update_rule: str = "gated_delta"  # the only algorithm
    state_dtype: str = "float32"  # the only state dtype

    @classmethod
    def from_json(cls, obj: Any) -> "MemoryConfig":
        """Validate the fields it knows (``MEMORY_FIELDS``); other keys are the caller's to keep."""
        if not isinstance(obj, dict):
            raise CheckpointError("config.json: 'memt' must be an object")
        for name in ("chunk_tokens", "num_heads", "key_dim", "value_dim"):
            if name not in obj:
                raise CheckpointError(f"config.json: 'memt.{name}' is required")
            _positive_int(obj[name], f"memt.{name}")
        layers = obj.get("memory_layers")
        if not isinstance(layers, list) or not layers:
            raise CheckpointError("config.json: 'memt.memory_layers' must be a nonempty list of layer indices")
        for index in layers:
            if not isinstance(index, int) or isinstance(index, bool) or index < 0:
                raise CheckpointError(f"config.json: 'memt.memory_layers' has a bad layer index {index!r}")
        if len(set(layers)) != len(layers):
            raise CheckpointError("config.json: 'memt.memory_layers' lists a layer twice")
        rule = obj.get("update_rule", "gated_delta")
        if rule != "gated_delta":
            raise CheckpointError(f"config.json: 'memt.update_rule' must be 'gated_delta', got {rule!r}")
        dtype = obj.get("state_dtype", "float32")
        if dtype != "float32":
            raise CheckpointError(f"config.json: 'memt.state_dtype' must be 'float32', got {dtype!r}")
        return cls(
            chunk_tokens=obj["chunk_tokens"],
            memory_layers=tuple(sorted(layers)),
            num_heads=obj["num_heads"],
            key_dim=obj["key_dim"],
            value_dim=obj["value_dim"],
            update_rule=rule,
            state_dtype=dtype,
        )

    def to_json(self) -> dict:
        data = asdict(self)
        data["memory_layers"] = list(self.memory_layers)
        return data

    def state_shape(self) -> tuple[int, int, int, int]:
        """Shape of one layer's memory tensor: ``[1, H, K, V]``."""
        return (1, self.num_heads, self.key_dim, self.value_dim)


RUNTIME_FIELDS = ("max_sessions_per_rank", "max_inflight_commits_per_rank", "min_kv_tokens")


@dataclass(frozen=True)
class RuntimeConfig:
    """``memt_runtime``: serving capacity limits; every field a positive integer, default 1."""

    max_sessions_per_rank: int = 1
    max_inflight_commits_per_rank: int = 1
    min_kv_tokens: int = 1

    @staticmethod
    def split(obj: Any, where: str) -> tuple[dict[str, int], dict[str, Any]]:
        """A ``memt_runtime`` object as (validated known fields, unknown keys untouched)."""
        if not isinstance(obj, dict):
            raise CheckpointError(f"{where}: 'memt_runtime' must be an object")
        known = {name: value for name, value in obj.items() if name in RUNTIME_FIELDS}
        for name, value in known.items():
            _positive_int(value, f"memt_runtime.{name}", where=where)
        return known, {name: value for name, value in obj.items() if name not in RUNTIME_FIELDS}

    @classmethod
    def parse(cls, obj: Any, where: str) -> dict[str, int]:
        """Validate a partial ``memt_runtime`` from an operator (``where`` names it): unknown keys are refused."""
        known, unknown = cls.split(obj, where)
        if unknown:
            raise CheckpointError(
                f"{where}: unknown field(s) in 'memt_runtime': {', '.join(sorted(unknown))}; "
                f"allowed: {', '.join(RUNTIME_FIELDS)}"
            )
        return known

    @classmethod
    def merge(
        cls,
        checkpoint: Mapping[str, int] | None = None,
        override: Mapping[str, int] | None = None,
        explicit: Mapping[str, int | None] | None = None,
    ) -> "RuntimeConfig":
        """Defaults → checkpoint → JSON override → explicit values (``None`` means not given)."""
        merged = asdict(cls())
        for layer, where in ((checkpoint, "checkpoint"), (override, "--json-model-override-args")):
            if layer:
                merged.update(cls.parse(dict(layer), where))
        for name, value in (explicit or {}).items():
            if value is not None:
                if name not in RUNTIME_FIELDS:
                    raise CheckpointError(f"unknown runtime field {name!r}")
                _positive_int(value, name, where="--" + name.replace("_", "-"))
                merged[name] = value
        return cls(**merged)


def parse_override_args(text: str | None) -> dict[str, int]:
    """``--json-model-override-args``: only ``{"memt_runtime": {...}}`` is accepted."""
    if not text:
        return {}
    try:
        obj = json.loads(text)
    except json.JSONDecodeError as exc:
        raise CheckpointError(f"--json-model-override-args is not valid JSON: {exc}") from exc
    if not isinstance(obj, dict) or set(obj) - {"memt_runtime"}:
        keys = sorted(obj) if isinstance(obj, dict) else []
        raise CheckpointError(
            "--json-model-override-args accepts only {\"memt_runtime\": {...}}; model structure comes from "
            f"config.json (got keys: {', '.join(keys) or type(obj).__name__})"
        )
    return RuntimeConfig.parse(obj.get("memt_runtime", {}), "--json-model-override-args")


@dataclass(frozen=True)
class Checkpoint:
    """A validated checkpoint directory (weights are not read until the model is loaded)."""

    path: Path
    model_type: str
    model: str  # the family's public name
    config: dict = field(repr=False)
    config_sha256: str = ""
    checkpoint_id: str | None = None
    memory: MemoryConfig | None = None
    runtime: dict = field(default_factory=dict)  # the checkpoint's own memt_runtime values
    backbone: dict = field(default_factory=dict, repr=False)  # backbone config as transformers reads it
    family: Family | None = field(default=None, repr=False, compare=False)
    extra: dict = field(default_factory=dict)  # unknown keys kept: {"memt": {...}, "memt_runtime": {...}}

    @property
    def served_name(self) -> str:
        """The model name servers list this checkpoint under (unless told another): its ``checkpoint_id``, else
        its directory's name; both servers' start-up lines say it, beside the family (``model``)."""
        return self.checkpoint_id or self.path.name

    @property
    def unknown_keys(self) -> list[str]:
        """Keys of ``memt`` / ``memt_runtime`` this version does not read, as ``section.key``."""
        return sorted(f"{section}.{key}" for section, keys in self.extra.items() for key in keys)

    @property
    def hidden_size(self) -> int:
        return int(self.backbone["hidden_size"])

    @property
    def num_hidden_layers(self) -> int:
        return int(self.backbone["num_hidden_layers"])

    def native_encoding(self) -> dict:
        """How prompts are encoded, as the family defines it (template or encoder script, with its digest)."""
        return self.family.native_encoding(self.path)

    def chat_template(self) -> str | None:
        """The chat template text, from ``chat_template.jinja`` or ``tokenizer_config.json``."""
        jinja = self.path / "chat_template.jinja"
        if jinja.is_file():
            return jinja.read_text(encoding="utf-8")
        config = self.path / "tokenizer_config.json"
        if config.is_file():
            template = json.loads(config.read_text(encoding="utf-8")).get("chat_template")
            if isinstance(template, str):
                return template
        return None

    def vocabulary_sha256(self) -> str | None:
        """SHA-256 of the tokenizer's vocabulary and added tokens, canonically serialised."""
        path = self.path / "tokenizer.json"
        if not path.is_file():
            return None
        data = json.loads(path.read_text(encoding="utf-8"))
        vocab = {"model": data.get("model", {}).get("vocab"), "added_tokens": data.get("added_tokens")}
        return _sha256_json(vocab)

    def identity(self) -> str:
        """The snapshot identity: SHA-256 over backbone, memory, encoding, template and vocabulary (and the digest
        of an external backbone's weights, for a checkpoint that names one)."""
        weights = self.family.weights_identity(self.config)
        return _sha256_json(
            {
                **({"backbone_weights": weights} if weights is not None else {}),
                "format": SNAPSHOT_FORMAT,
                "model": self.model,
                "backbone": self.backbone,
                "memt": {**self.memory.to_json(), **self.extra.get("memt", {})} if self.memory else None,
                "native_encoding": self.native_encoding(),
                "chat_template": self.chat_template(),
                "vocabulary": self.vocabulary_sha256(),
            }
        )

    def describe(self) -> dict:
        """The fields of ``GET /memt/identity`` that come from the checkpoint."""
        return {
            "model": self.model,
            "model_type": self.model_type,
            "config_sha256": self.config_sha256,
            "checkpoint_id": self.checkpoint_id,
            "identity": self.identity(),
        }

    def with_backbone(self, backbone: dict) -> "Checkpoint":
        return replace(self, backbone=backbone)


def read_checkpoint(path: str | Path, *, validate_backbone: bool = True) -> Checkpoint:
    """Read and validate ``config.json``; refuse anything that would run checkpoint code.

    ``validate_backbone`` builds the transformers config of the backbone to check layer types; the
    client, which only needs identities, may skip it.
    """
    root = Path(path)
    config_path = root / "config.json"
    if not root.is_dir():
        raise CheckpointError(f"checkpoint directory {str(root)!r} does not exist")
    if not config_path.is_file():
        raise CheckpointError(f"checkpoint {str(root)!r} has no config.json")
    raw = config_path.read_bytes()
    try:
        config = json.loads(raw)
    except json.JSONDecodeError as exc:
        raise CheckpointError(f"config.json is not valid JSON: {exc}") from exc
    if not isinstance(config, dict):
        raise CheckpointError("config.json must hold a JSON object")

    model_type = config.get("model_type")
    family = families.by_model_type(model_type)
    if family is None:
        raise CheckpointError(
            f"config.json: unknown model_type {model_type!r}; expected one of {', '.join(sorted(families.model_types()))}"
        )
    _refuse_remote_code(config)
    refuse_quantized(config)
    architectures = config.get("architectures")
    if architectures is not None and architectures != [family.architecture]:
        raise CheckpointError(f"config.json: 'architectures' must be [{family.architecture!r}] for {model_type}")

    checkpoint_id = config.get("memt_checkpoint_id")
    if checkpoint_id is not None and (not isinstance(checkpoint_id, str) or not checkpoint_id.strip()):
        raise CheckpointError("config.json: 'memt_checkpoint_id' must be a nonempty string when present")

    if "memt" not in config:
        raise CheckpointError("config.json: the 'memt' object is required")
    memory = MemoryConfig.from_json(config["memt"])
    extra = {"memt": {k: v for k, v in config["memt"].items() if k not in MEMORY_FIELDS}}
    runtime, extra["memt_runtime"] = RuntimeConfig.split(config.get("memt_runtime", {}), "config.json")
    extra = {section: keys for section, keys in extra.items() if keys}

    backbone = family.backbone(config)
    for name in ("hidden_size", "num_hidden_layers"):
        if name not in backbone:
            raise CheckpointError(f"config.json: backbone field {name!r} is required")

    checkpoint = Checkpoint(
        path=root,
        model_type=model_type,
        model=family.name,
        config=config,
        config_sha256=hashlib.sha256(raw).hexdigest(),
        checkpoint_id=checkpoint_id,
        memory=memory,
        runtime=runtime,
        backbone=backbone,
        family=family,
        extra=extra,
    )
    if validate_backbone:
        check_memory_layers(checkpoint, family.layer_types(backbone_config(checkpoint)))
    return checkpoint


def backbone_config(checkpoint: Checkpoint):
    """The transformers config object of the checkpoint's backbone, built by its family."""
    return checkpoint.family.backbone_config(checkpoint.backbone)


def check_memory_layers(checkpoint: Checkpoint, layer_types: list[str]) -> None:
    """Each memory layer must exist and be a native attention layer of the backbone."""
    allowed = checkpoint.family.native_attention
    for index in checkpoint.memory.memory_layers:
        if index >= len(layer_types):
            raise CheckpointError(
                f"config.json: 'memt.memory_layers' names layer {index}, but the backbone has "
                f"{len(layer_types)} layers"
            )
        if layer_types[index] not in allowed:
            raise CheckpointError(
                f"config.json: 'memt.memory_layers' names layer {index}, a {layer_types[index]!r} layer; "
                f"memory layers must be native attention layers ({', '.join(sorted(allowed))})"
            )


def _refuse_remote_code(config: dict) -> None:
    if "auto_map" in config:
        raise CheckpointError(
            "config.json: 'auto_map' asks to run checkpoint Python code; MemT serve never executes checkpoint code"
        )
    if config.get("trust_remote_code"):
        raise CheckpointError("config.json: 'trust_remote_code' is refused; checkpoint code is never executed")


def _positive_int(value: Any, name: str, where: str = "config.json") -> None:
    if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
        raise CheckpointError(f"{where}: {name!r} must be a positive integer, got {value!r}")


def _sha256_json(value: Any) -> str:
    text = json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return hashlib.sha256(text.encode("utf-8")).hexdigest()

