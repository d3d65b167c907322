"""Training memory onto a frozen backbone (memt_demo.smol, TrainConfig.backbone), on a tiny stand-in backbone.

A tiny random Llama is "converted" into a backbone home the way ``python -m memt_core.backbones`` lays one out
(model.safetensors, config.json, tokenizer/, SOURCE.json), so the whole path runs in seconds without the wheel.
"""

from __future__ import annotations

import json
from dataclasses import replace

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import load_file, save_file

from backbone_home import convert_tiny
from memt_core.families.smol import BACKBONE_FILE
from memt_core.models.weights import SINGLE_FILE, load_model
from memt_demo.compare import confirms, repeated_exactly
from memt_demo.episodes import Mix
from memt_demo.train import ModelShape, TrainConfig, train


@pytest.fixture
def tiny_backbone(tmp_path, smol_checkpoint, monkeypatch):
    monkeypatch.setenv("MEMT_BACKBONES", str(tmp_path / "backbones"))
    return convert_tiny(smol_checkpoint, tmp_path / "backbones")


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


# --------------------------------------------------------------------------- LoRA beside the memory


def lora_config(**kwargs) -> TrainConfig:
    settings = dict(steps=2, batch_size=2, lr=1e-2, backbone="tiny-llama", lora_rank=4, lora_alpha=8.0,
                    shape=replace(ModelShape(), memory_layers=(2, 3), memory_heads=2, key_dim=16, value_dim=16, chunk_tokens=32))
    return replace(TrainConfig(), **{**settings, **kwargs})


def MIX(progress: float) -> Mix:
    return Mix(thinking=0.0, tool_call=0.0, tool_answer=0.0)


def test_lora_trains_beside_the_memory_and_is_merged_when_served(tmp_path, tiny_backbone):
    from memt_core.models.lora import LoraConfig, pairs

    trained = train(lora_config(), tmp_path / "run", log=lambda line: None, mix_for=MIX)
    with safe_open(str(tmp_path / "run" / SINGLE_FILE), framework="pt") as handle:
        saved = {key: handle.get_tensor(key) for key in handle.keys()}
    config = json.loads((tmp_path / "run" / "config.json").read_text())
    assert config["memt_lora"] == {"rank": 4, "alpha": 8.0}
    found = pairs(saved, LoraConfig.from_config(config))
    # every projection of the layers from the lowest memory layer up (2 and 3), none below
    assert sorted({path.split(".")[2] for path in found}) == ["2", "3"] and len(found) == 2 * 7
    assert all(key.startswith(("memt.", "lora.")) for key in saved)
    served = load_model(tmp_path / "run")  # merged: a plain backbone with W + (alpha / rank) B A
    path = "model.layers.2.self_attn.q_proj"
    a, b = saved[f"lora.{path}.A"].float(), saved[f"lora.{path}.B"].float()
    base = load_file(str(tiny_backbone / BACKBONE_FILE))[f"{path}.weight"].float()
    assert torch.count_nonzero(b)  # training moved it away from its zero start
    assert torch.allclose(served.backbone.get_submodule(path).weight, base + 2.0 * (b @ a), atol=1e-5)
    ids = torch.randint(3, 100, (1, 16))
    with torch.no_grad():
        assert torch.allclose(served(ids).logits, trained.eval()(ids).logits, atol=1e-3)  # merged = peft layers (BF16 saved)


def test_a_lora_checkpoint_continues_training_unmerged(tmp_path, tiny_backbone):
    train(lora_config(), tmp_path / "a", log=lambda line: None, mix_for=MIX)
    model = train(lora_config(steps=1), tmp_path / "b", log=lambda line: None, mix_for=MIX, init_from=tmp_path / "a")
    trainable = {name for name, p in model.named_parameters() if p.requires_grad}
    assert trainable and all(".lora_" in name or name.startswith("memt.") for name in trainable)
    with safe_open(str(tmp_path / "b" / SINGLE_FILE), framework="pt") as handle:
        assert sum(key.startswith("lora.") for key in handle.keys()) == 2 * 2 * 7


def test_lora_tensors_without_their_config_or_pair_are_refused(tmp_path, tiny_backbone):
    from memt_core.errors import CheckpointError

    train(lora_config(), tmp_path / "run", log=lambda line: None, mix_for=MIX)
    root = tmp_path / "run"
    config = json.loads((root / "config.json").read_text())
    del config["memt_lora"]
    (root / "config.json").write_text(json.dumps(config))
    with pytest.raises(CheckpointError, match="no 'memt_lora'"):
        load_model(root)
    config["memt_lora"] = {"rank": 4, "alpha": 8.0}
    (root / "config.json").write_text(json.dumps(config))
    tensors = load_file(str(root / SINGLE_FILE))
    del tensors["lora.model.layers.2.self_attn.q_proj.B"]
    save_file(tensors, str(root / SINGLE_FILE), metadata={"format": "pt"})
    with pytest.raises(CheckpointError, match="needs both"):
        load_model(root)
    config["memt_lora"] = {"rank": 0, "alpha": 8.0}
    (root / "config.json").write_text(json.dumps(config))
    with pytest.raises(CheckpointError, match="memt_lora.rank"):
        load_model(root)


def test_train_smol_refuses_an_unknown_or_negative_mix_field_before_training(tmp_path):
    import subprocess
    import sys
    from pathlib import Path

    script = Path(__file__).resolve().parents[2] / "scripts" / "train_smol.py"
    for bad, said in (("nope=1", "is not FIELD=VALUE"), ("long=-1", "long must be ≥ 0")):
        run = subprocess.run([sys.executable, str(script), "--out", str(tmp_path / "x"), "--mix", bad],
                             capture_output=True, text=True, timeout=120)
        assert run.returncode == 2 and said in run.stderr, run.stderr
    assert not (tmp_path / "x").exists()
