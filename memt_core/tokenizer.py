"""Loading a MemT checkpoint's tokenizer from its files alone: shared by the server and the client.

No transformers at import time (the client extra has no PyTorch; transformers is imported on use).
"""

from __future__ import annotations

import json
from pathlib import Path

from memt_core import families


def register_with_transformers() -> None:
    """Teach transformers' Auto classes the MemT names, so they read MemT checkpoints as documented.

    ``AutoTokenizer.from_pretrained(path, tokenizer_type=...)`` learns the names the families document
    (Flash: ``deepseek_v4``; a MemT tokenizer is a plain fast tokenizer, ``TokenizersBackend``), and
    ``AutoConfig`` learns each family's ``model_type`` as a plain configuration, so loading a tokenizer
    no longer warns that a ``memt_*`` model is being read as an unknown type. No model code is involved.
    """
    global _registered
    if _registered:
        return
    from transformers import AutoConfig, PreTrainedConfig
    from transformers.models.auto import tokenization_auto

    for name in families.names():
        family = families.get(name)
        if family.tokenizer_type:
            tokenization_auto.TOKENIZER_MAPPING_NAMES.setdefault(family.tokenizer_type, "TokenizersBackend")
        config = type(f"{family.architecture.removesuffix('ForCausalLM')}Config", (PreTrainedConfig,), {"model_type": family.model_type})
        AutoConfig.register(family.model_type, config, exist_ok=True)
    _registered = True


_registered = False


def load_tokenizer(path: str | Path, **kwargs):
    """``AutoTokenizer.from_pretrained(path, local_files_only=True, trust_remote_code=False)`` for a MemT checkpoint.

    Transformers does not know the ``memt_*`` model types, so ``AutoTokenizer`` cannot build their
    model configuration (for Flash its generic fallback even rejects the layer types). When the
    checkpoint's ``tokenizer_config.json`` names its tokenizer class, the configuration is not needed:
    an empty one is passed and the class comes from ``tokenizer_config.json``. No checkpoint code runs.
    """
    from transformers import AutoTokenizer

    register_with_transformers()
    kwargs = {"local_files_only": True, "trust_remote_code": False, **kwargs}
    if kwargs["trust_remote_code"]:
        raise ValueError("trust_remote_code is refused: MemT never executes checkpoint Python code")
    config_path = Path(path) / "tokenizer_config.json"
    named = False
    if config_path.is_file():
        try:
            named = bool(json.loads(config_path.read_text(encoding="utf-8")).get("tokenizer_class"))
        except ValueError:
            named = False
    if named and "config" not in kwargs:
        try:
            from transformers import PreTrainedConfig
        except ImportError:  # older transformers
            from transformers import PretrainedConfig as PreTrainedConfig
        kwargs["config"] = PreTrainedConfig()
    return AutoTokenizer.from_pretrained(str(path), **kwargs)
