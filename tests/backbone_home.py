"""A tiny stand-in for a converted backbone: a tiny memt-smol checkpoint's backbone laid out in a backbone home as
``python -m memt_core.backbones`` lays one out (``model.safetensors``, ``config.json``, ``tokenizer/``, ``SOURCE.json``)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from safetensors.torch import load_file, save_file

from memt_core.families.smol import BACKBONE_FILE, file_sha256
from memt_core.models.weights import SINGLE_FILE


def convert_tiny(checkpoint: Path, home: Path, name: str = "tiny-llama") -> Path:
    """``home/name/`` holding ``checkpoint``'s backbone tensors (not its memory); returns that directory."""
    directory = home / name
    (directory / "tokenizer").mkdir(parents=True)
    tensors = load_file(str(checkpoint / SINGLE_FILE))
    save_file({k: v for k, v in tensors.items() if not k.startswith("memt.")}, str(directory / BACKBONE_FILE), metadata={"format": "pt"})
    (directory / "config.json").write_text(json.dumps(json.loads((checkpoint / "config.json").read_text())["backbone_configs"]))
    for file in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copyfile(checkpoint / file, directory / "tokenizer" / file)
    source = {"name": name, "title": "tiny", "license": "none", "package": "tests", "version": "0", "file": "x",
              "sha256": file_sha256(directory / BACKBONE_FILE)}
    (directory / "SOURCE.json").write_text(json.dumps(source))
    return directory
