"""The memt-smol family: a Llama backbone with memory, its chat format, and a backbone kept outside the checkpoint.

Everything here runs on tiny random checkpoints (no wheel needed). ``test_real_backbone`` (slow) loads the
SmolLM2-135M-Instruct conversion when ``python -m memt_core.backbones`` has made it, and skips otherwise.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import save_file

from backbone_home import convert_tiny
from memt_core import families
from memt_core.checkpoint import read_checkpoint
from memt_core.client.chat_format import SmolChatFormat, load_chat_format
from memt_core.errors import CheckpointError
from memt_core.families.smol import BACKBONE_FILE, DEFAULT_SYSTEM_PROMPT, file_sha256
from memt_core.models.weights import SINGLE_FILE, load_model, save_weights
from memt_core.tokenizer import load_tokenizer


def test_the_family_is_registered_as_an_extension():
    smol = families.get(families.SMOL)
    assert (smol.model_type, smol.architecture, smol.backbone_model_class) == ("memt_llama", "MemTLlamaForCausalLM", "LlamaForCausalLM")
    assert families.by_model_type("memt_llama") is smol
    assert smol.decode_step is None  # the fused decode step is Nano's; the engine decodes with the model


def test_a_tiny_checkpoint_reads_and_describes_itself(smol_checkpoint):
    checkpoint = read_checkpoint(smol_checkpoint)
    assert checkpoint.model == "memt-smol"
    assert checkpoint.describe()["model"] == "memt-smol"
    assert checkpoint.memory.memory_layers == (2, 3)


def test_memory_layers_must_exist(tmp_path, smol_checkpoint):
    root = tmp_path / "ck"
    shutil.copytree(smol_checkpoint, root)
    config = json.loads((root / "config.json").read_text())
    config["memt"]["memory_layers"] = [4]
    (root / "config.json").write_text(json.dumps(config))
    with pytest.raises(CheckpointError, match="names layer 4, but the backbone has 4 layers"):
        read_checkpoint(root)


# --------------------------------------------------------------------------- prompts


@pytest.fixture(scope="module")
def smol_format(smol_checkpoint):
    chat_format, parser = load_chat_format(smol_checkpoint, tokenizer=load_tokenizer(smol_checkpoint))
    return chat_format


def test_the_chat_format_is_smollm2s_chatml_without_thinking(smol_format):
    assert isinstance(smol_format, SmolChatFormat)
    text = smol_format.tokenizer.decode(smol_format.conversation_ids([{"role": "user", "content": "hi"}]))
    assert text == (f"<|im_start|>system\n{DEFAULT_SYSTEM_PROMPT}<|im_end|>\n<|im_start|>user\nhi<|im_end|>\n"
                    "<|im_start|>assistant\n")
    assert smol_format.thinking(True) is False


def test_a_prompt_in_pieces_equals_the_whole_conversation(smol_format):
    """The default system prompt opens a prompt once: never inside a committed turn, tool results or history."""
    fmt = smol_format
    turn = fmt.user_ids("My name is Ada.") + fmt.tokenizer.encode("Nice to meet you, Ada.", add_special_tokens=False) + list(fmt.end_ids)[:1]
    assert DEFAULT_SYSTEM_PROMPT not in fmt.tokenizer.decode(turn)
    pieces = fmt.prompt_ids(system_prompt=None, tools=None, turns=[], tail=fmt.user_ids("Hello"))
    assert pieces == fmt.conversation_ids([{"role": "user", "content": "Hello"}])
    named = fmt.prompt_ids(system_prompt="Be brief.", tools=None, turns=[], tail=fmt.user_ids("Hello"))
    assert named == fmt.conversation_ids([{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hello"}])
    assert DEFAULT_SYSTEM_PROMPT not in fmt.tokenizer.decode(named)
    tools = [{"type": "function", "function": {"name": "add", "parameters": {"type": "object"}}}]
    with_tools = fmt.prompt_ids(system_prompt=None, tools=tools, turns=[], tail=fmt.user_ids("Add 2 and 3"))
    assert with_tools == fmt.conversation_ids([{"role": "user", "content": "Add 2 and 3"}], tools=tools)


def test_the_template_default_is_the_one_python_names(smol_checkpoint):
    template = (smol_checkpoint / "chat_template.jinja").read_text()
    assert f"'{DEFAULT_SYSTEM_PROMPT}'" in template


# --------------------------------------------------------------------------- a backbone outside the checkpoint


def split_backbone(source: Path, root: Path, home: Path, *, name: str = "tiny-llama") -> Path:
    """A copy of ``source`` whose backbone tensors live in ``home/name/model.safetensors`` (named by SHA-256)."""
    shutil.copytree(source, root)
    backbone = convert_tiny(source, home, name) / BACKBONE_FILE
    with safe_open(str(root / SINGLE_FILE), framework="pt") as handle:
        memory = {key: handle.get_tensor(key) for key in handle.keys() if key.startswith("memt.")}
    save_file(memory, str(root / SINGLE_FILE), metadata={"format": "pt"})
    config = json.loads((root / "config.json").read_text())
    config["memt_backbone"] = {"name": name, "sha256": file_sha256(backbone)}
    (root / "config.json").write_text(json.dumps(config))
    return root


@pytest.fixture
def external(tmp_path, smol_checkpoint, monkeypatch):
    home = tmp_path / "backbones"
    monkeypatch.setenv("MEMT_BACKBONES", str(home))
    return split_backbone(smol_checkpoint, tmp_path / "ck", home), home / "tiny-llama" / BACKBONE_FILE


def test_an_external_backbone_loads_the_same_model(external, smol_model):
    root, _ = external
    with safe_open(str(root / SINGLE_FILE), framework="pt") as handle:
        assert all(key.startswith("memt.") for key in handle.keys())  # the checkpoint holds only the memory
    model = load_model(root)
    ids = torch.randint(3, 100, (1, 12))
    with torch.no_grad():
        assert torch.equal(model(ids).logits, smol_model(ids).logits)


def test_saving_stores_only_what_the_backbone_does_not_hold(external, tmp_path):
    root, _ = external
    model = load_model(root)
    out = tmp_path / "saved"
    out.mkdir()
    save_weights(model, out)
    with safe_open(str(out / SINGLE_FILE), framework="pt") as handle:
        keys = set(handle.keys())
    assert keys and all(key.startswith("memt.layers.") for key in keys)


def test_a_missing_backbone_is_refused_with_how_to_get_it(external):
    root, backbone = external
    backbone.unlink()
    with pytest.raises(CheckpointError, match=r"not installed at .*python -m memt_core.backbones tiny-llama"):
        load_model(root)


def test_another_backbone_is_refused(external):
    root, backbone = external
    with safe_open(str(backbone), framework="pt") as handle:
        tensors = {key: handle.get_tensor(key) for key in handle.keys()}
    tensors["model.norm.weight"] = tensors["model.norm.weight"] + 1
    save_file(tensors, str(backbone), metadata={"format": "pt"})
    with pytest.raises(CheckpointError, match="is not the one this checkpoint was trained on"):
        load_model(root)


def test_the_backbone_digest_enters_the_snapshot_identity(external):
    root, _ = external
    before = read_checkpoint(root).identity()
    config = json.loads((root / "config.json").read_text())
    config["memt_backbone"]["sha256"] = "0" * 64
    (root / "config.json").write_text(json.dumps(config))
    assert read_checkpoint(root).identity() != before


@pytest.mark.parametrize("bad, message", [
    ({"name": "../x", "sha256": "0" * 64}, "memt_backbone.name"),
    ({"name": "tiny", "sha256": "XYZ"}, "memt_backbone.sha256"),
    ("tiny", "'memt_backbone' must be an object"),
])
def test_a_malformed_backbone_spec_is_refused(tmp_path, smol_checkpoint, bad, message):
    root = tmp_path / "ck"
    shutil.copytree(smol_checkpoint, root)
    config = json.loads((root / "config.json").read_text())
    config["memt_backbone"] = bad
    (root / "config.json").write_text(json.dumps(config))
    with pytest.raises(CheckpointError, match=message):
        read_checkpoint(root)


# --------------------------------------------------------------------------- the real backbone (when converted)


@pytest.fixture(scope="module")
def real_checkpoint(tmp_path_factory):
    """A memt-smol checkpoint on the converted SmolLM2-135M-Instruct with fresh (untrained) memory modules."""
    from dataclasses import replace

    from memt_core.backbones import DEFAULT, installed
    from memt_demo import smol
    from memt_demo.train import ModelShape, TrainConfig

    if installed(DEFAULT) is None:
        pytest.skip(f"the backbone {DEFAULT} is not converted (bash scripts/setup.sh or python -m memt_core.backbones)")
    root = tmp_path_factory.mktemp("smol-real")
    config = replace(TrainConfig(), backbone=DEFAULT, shape=replace(ModelShape(), memory_layers=(16, 28)))
    smol.write_skeleton(root, DEFAULT, config.shape)
    save_weights(smol.init_model(root, config), root)
    return root


def test_real_backbone_with_empty_memory_is_the_backbone(real_checkpoint):
    """Served with memory off, the checkpoint answers as SmolLM2-135M-Instruct itself: the same logits as
    transformers' LlamaForCausalLM on the converted weights, and its plain answer to a plain question."""
    from safetensors.torch import load_file
    from transformers import LlamaForCausalLM

    from memt_core.checkpoint import backbone_config

    checkpoint = read_checkpoint(real_checkpoint)
    model = load_model(real_checkpoint)
    (path,) = checkpoint.family.backbone_weights(checkpoint.path, checkpoint.config)
    plain = LlamaForCausalLM(backbone_config(checkpoint)).float().eval()
    plain.load_state_dict({k: v.float() for k, v in load_file(str(path)).items()})
    chat_format, _ = load_chat_format(real_checkpoint, tokenizer=load_tokenizer(real_checkpoint))
    ids = torch.tensor([chat_format.conversation_ids([{"role": "user", "content": "What is the capital of France?"}])])
    with torch.no_grad():
        assert torch.equal(model(ids).logits, plain(input_ids=ids).logits)
        generated = plain.generate(ids, max_new_tokens=8, do_sample=False, eos_token_id=sorted(chat_format.end_ids))
    assert "Paris" in chat_format.decode(generated[0, ids.shape[1]:].tolist())
