"""Training memory onto a frozen backbone (memt_demo.smol, TrainConfig.backbone), on a tiny stand-in backbone.

A tiny random Llama is "converted" into a backbone home the way ``python -m memt_core.backbones`` lays one out
(model.safetensors, config.json, tokenizer/, SOURCE.json), so the whole path runs in seconds without the wheel.
"""

from __future__ import annotations

import json
import shutil
from dataclasses import replace

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import load_file, save_file

from memt_core.families.smol import BACKBONE_FILE, file_sha256
from memt_core.models.weights import SINGLE_FILE, load_model
from memt_demo.compare import confirms, repeated_exactly
from memt_demo.episodes import Mix
from memt_demo.train import ModelShape, TrainConfig, train


@pytest.fixture
def tiny_backbone(tmp_path, smol_checkpoint, monkeypatch):
    home = tmp_path / "backbones"
    directory = home / "tiny-llama"
    (directory / "tokenizer").mkdir(parents=True)
    tensors = load_file(str(smol_checkpoint / SINGLE_FILE))
    save_file({k: v for k, v in tensors.items() if not k.startswith("memt.")}, str(directory / BACKBONE_FILE), metadata={"format": "pt"})
    config = json.loads((smol_checkpoint / "config.json").read_text())["backbone_configs"]
    (directory / "config.json").write_text(json.dumps(config))
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copyfile(smol_checkpoint / name, directory / "tokenizer" / name)
    source = {"name": "tiny-llama", "title": "tiny", "license": "none", "package": "tests", "version": "0", "file": "x",
              "sha256": file_sha256(directory / BACKBONE_FILE)}
    (directory / "SOURCE.json").write_text(json.dumps(source))
    monkeypatch.setenv("MEMT_BACKBONES", str(home))
    return directory


def test_training_changes_only_the_memory(tmp_path, tiny_backbone):
    config = replace(TrainConfig(), steps=3, batch_size=2, lr=1e-2, log_every=1, backbone="tiny-llama", reply_weight=0.0,
                     shape=replace(ModelShape(), memory_layers=(2, 3), memory_heads=2, key_dim=16, value_dim=16, chunk_tokens=32))
    out = tmp_path / "run"
    lines: list[str] = []
    train(config, out, log=lines.append, mix_for=lambda progress: Mix(thinking=0.0, tool_call=0.0, tool_answer=0.0),
          save_every=2)
    assert any("(" in line and "M trained)" in line for line in lines)
    assert any(line == "saved the weights at step 2" for line in lines)
    with safe_open(str(out / SINGLE_FILE), framework="pt") as handle:
        saved = set(handle.keys())
    assert saved and all(key.startswith("memt.layers.") for key in saved)  # the checkpoint holds only what training made
    config_json = json.loads((out / "config.json").read_text())
    assert config_json["memt_backbone"]["name"] == "tiny-llama"
    trained = load_model(out)  # the backbone from the home, the memory from the checkpoint
    backbone = load_file(str(tiny_backbone / BACKBONE_FILE))
    for name, tensor in trained.backbone.state_dict().items():
        assert torch.equal(tensor, backbone[name].float()), name  # frozen
    assert any(torch.count_nonzero(p).item() for p in trained.memt.parameters())


def test_continuing_a_run_keeps_the_backbone_frozen(tmp_path, tiny_backbone):
    config = replace(TrainConfig(), steps=1, batch_size=1, backbone="tiny-llama",
                     shape=replace(ModelShape(), memory_layers=(3,), memory_heads=2, key_dim=16, value_dim=16, chunk_tokens=32))
    mix = lambda progress: Mix(thinking=0.0, tool_call=0.0, tool_answer=0.0)  # noqa: E731
    train(config, tmp_path / "a", log=lambda line: None, mix_for=mix)
    model = train(config, tmp_path / "b", log=lambda line: None, mix_for=mix, init_from=tmp_path / "a")
    assert not any(p.requires_grad for p in model.backbone.parameters())
    assert all(p.requires_grad for p in model.memt.parameters())


@pytest.mark.parametrize("answer, text, exact", [
    ("hello world", "hello world", True), ("'hello world'", "hello world", True), ("Hello world.", "hello world", True),
    ("Type 'hello world' is not possible.", "hello world", False), ("windas", "hello world", False),
    ("hello world!", "hello world", False),
])
def test_repeated_exactly(answer, text, exact):
    assert repeated_exactly(answer, text) is exact


@pytest.mark.parametrize("answer, confirmed", [
    ("Yes, you live in Paris.", True), ("That's right!", True), ("Correct.", True),
    ("No, you live in Lisbon.", False), ("You told me you live in Lisbon.", False), ("", False),
])
def test_confirms(answer, confirmed):
    assert confirms(answer) is confirmed
