"""Checkpoint directories: validation of config.json and weights, runtime merge order, identities.

Every refusal is a ``CheckpointError`` whose message names the field (or tensor) at fault. Tests
edit a private copy of the session's tiny checkpoints.
"""

from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path
from typing import Callable

import pytest
import torch
from safetensors.torch import load_file, save_file

from memt_core.checkpoint import (
    RuntimeConfig,
    parse_override_args,
    read_checkpoint,
)
from memt_core.errors import CheckpointError
from memt_core.families import FLASH, NANO
from memt_core.models.weights import INDEX_FILE, SINGLE_FILE, load_model


# --------------------------------------------------------------------------- helpers


def copy_checkpoint(source: Path, tmp_path: Path, name: str = "ckpt") -> Path:
    return Path(shutil.copytree(source, tmp_path / name))


def edit_config(root: Path, edit: Callable[[dict], None]) -> Path:
    config = json.loads((root / "config.json").read_text(encoding="utf-8"))
    edit(config)
    (root / "config.json").write_text(json.dumps(config, indent=2, ensure_ascii=False), encoding="utf-8")
    return root


def edit_weights(root: Path, edit: Callable[[dict], None]) -> Path:
    tensors = load_file(str(root / SINGLE_FILE))
    edit(tensors)
    save_file(tensors, str(root / SINGLE_FILE), metadata={"format": "pt"})
    return root


def refusal(root: Path, *, load: bool = False) -> str:
    """The message of the CheckpointError that reading (or loading) ``root`` raises."""
    with pytest.raises(CheckpointError) as info:
        load_model(root) if load else read_checkpoint(root)
    return str(info.value)


@pytest.fixture
def nano_copy(nano_checkpoint, tmp_path) -> Path:
    return copy_checkpoint(nano_checkpoint, tmp_path, "nano")


@pytest.fixture
def flash_copy(flash_checkpoint, tmp_path) -> Path:
    return copy_checkpoint(flash_checkpoint, tmp_path, "flash")


# --------------------------------------------------------------------------- accepted checkpoints


def test_reads_the_tiny_nano(nano_checkpoint):
    checkpoint = read_checkpoint(nano_checkpoint)
    assert checkpoint.model == NANO and checkpoint.model_type == "memt_qwen3_5_moe"
    assert checkpoint.checkpoint_id == "tiny-random-nano"
    assert checkpoint.memory.memory_layers == (1, 3)
    assert checkpoint.memory.state_shape() == (1, 2, 16, 16)
    assert checkpoint.hidden_size == 64 and checkpoint.num_hidden_layers == 4
    assert checkpoint.backbone["layer_types"][1] == "full_attention"
    assert checkpoint.runtime == {"max_sessions_per_rank": 64, "max_inflight_commits_per_rank": 4, "min_kv_tokens": 256}
    assert checkpoint.native_encoding() == {"name": "hf-chat-template"}


def test_reads_the_tiny_flash(flash_checkpoint):
    checkpoint = read_checkpoint(flash_checkpoint)
    assert checkpoint.model == FLASH and checkpoint.model_type == "memt_deepseek_v4"
    assert checkpoint.memory.memory_layers == (0, 1)
    # the flat config minus MemT's own keys is the DeepSeek-V4 backbone config
    assert checkpoint.backbone["model_type"] == "deepseek_v4"
    assert not {"memt", "memt_runtime", "memt_checkpoint_id", "architectures"} & set(checkpoint.backbone)
    encoding = checkpoint.native_encoding()
    assert encoding["name"] == "encoding_dsv4"
    assert encoding["sha256"] == hashlib.sha256((flash_checkpoint / "encoding_dsv4.py").read_bytes()).hexdigest()


def test_memory_layers_are_sorted(nano_copy):
    edit_config(nano_copy, lambda c: c["memt"].update(memory_layers=[3, 1]))
    assert read_checkpoint(nano_copy).memory.memory_layers == (1, 3)


def test_checkpoint_id_is_optional(nano_copy):
    edit_config(nano_copy, lambda c: c.pop("memt_checkpoint_id"))
    assert read_checkpoint(nano_copy).checkpoint_id is None


# --------------------------------------------------------------------------- config.json refusals


def test_missing_directory_and_config(tmp_path):
    with pytest.raises(CheckpointError, match="does not exist"):
        read_checkpoint(tmp_path / "nowhere")
    with pytest.raises(CheckpointError, match="has no config.json"):
        read_checkpoint(tmp_path)
    (tmp_path / "config.json").write_text("{not json")
    with pytest.raises(CheckpointError, match="config.json is not valid JSON"):
        read_checkpoint(tmp_path)
    (tmp_path / "config.json").write_text("[1, 2]")
    with pytest.raises(CheckpointError, match="must hold a JSON object"):
        read_checkpoint(tmp_path)


@pytest.mark.parametrize("model_type", ["qwen3_5_moe", "deepseek_v4", "llama", "memt_gpt2", None])
def test_unknown_model_type(nano_copy, model_type):
    edit_config(nano_copy, lambda c: c.update(model_type=model_type) if model_type else c.pop("model_type"))
    message = refusal(nano_copy)
    assert "model_type" in message and repr(model_type) in message
    assert "memt_deepseek_v4" in message and "memt_qwen3_5_moe" in message


def test_wrong_architectures(nano_copy):
    edit_config(nano_copy, lambda c: c.update(architectures=["MemTDeepseekV4ForCausalLM"]))
    assert "'architectures' must be ['MemTQwen3_5MoeForCausalLM']" in refusal(nano_copy)


def test_nano_without_backbone_configs(nano_copy):
    edit_config(nano_copy, lambda c: c.pop("backbone_configs"))
    assert "requires 'backbone_configs'" in refusal(nano_copy)


@pytest.mark.parametrize(
    "edit,field",
    [
        (lambda b: b.update(model_type="qwen3_moe"), "backbone_configs.model_type"),
        (lambda b: b.pop("text_config"), "backbone_configs.text_config"),
    ],
)
def test_nano_with_a_bad_backbone_configs(nano_copy, edit, field):
    edit_config(nano_copy, lambda c: edit(c["backbone_configs"]))
    assert field in refusal(nano_copy)


def test_flash_with_backbone_configs(flash_copy):
    edit_config(flash_copy, lambda c: c.update(backbone_configs={"model_type": "deepseek_v4"}))
    message = refusal(flash_copy)
    assert "must not contain 'backbone_configs'" in message


def test_nano_memory_layer_that_is_linear_attention(nano_copy):
    edit_config(nano_copy, lambda c: c["memt"].update(memory_layers=[0, 3]))
    message = refusal(nano_copy)
    assert "'memt.memory_layers' names layer 0, a 'linear_attention' layer" in message
    assert "full_attention" in message


@pytest.mark.parametrize("family", [NANO, FLASH])
def test_memory_layer_out_of_range(nano_copy, flash_copy, family):
    root, layers = (nano_copy, 4) if family == NANO else (flash_copy, 2)
    edit_config(root, lambda c: c["memt"].update(memory_layers=[1, layers]))
    assert f"'memt.memory_layers' names layer {layers}, but the backbone has {layers} layers" in refusal(root)


@pytest.mark.parametrize(
    "edit,field",
    [
        (lambda m: m.update(memory_layers=[]), "memt.memory_layers"),
        (lambda m: m.update(memory_layers=[1, 1]), "memt.memory_layers"),
        (lambda m: m.update(memory_layers=[-1]), "memt.memory_layers"),
        (lambda m: m.update(memory_layers="1,3"), "memt.memory_layers"),
        (lambda m: m.pop("chunk_tokens"), "memt.chunk_tokens"),
        (lambda m: m.update(chunk_tokens=0), "memt.chunk_tokens"),
        (lambda m: m.update(num_heads=-2), "memt.num_heads"),
        (lambda m: m.update(key_dim=16.0), "memt.key_dim"),
        (lambda m: m.update(value_dim=True), "memt.value_dim"),
        (lambda m: m.update(update_rule="delta"), "memt.update_rule"),
        (lambda m: m.update(state_dtype="bfloat16"), "memt.state_dtype"),
    ],
)
def test_bad_memt_fields(nano_copy, edit, field):
    edit_config(nano_copy, lambda c: edit(c["memt"]))
    assert field in refusal(nano_copy)


def test_memt_object_is_required(flash_copy):
    edit_config(flash_copy, lambda c: c.pop("memt"))
    assert "'memt' object is required" in refusal(flash_copy)


def test_memory_geometry_not_matching_the_weights(nano_copy):
    edit_config(nano_copy, lambda c: c["memt"].update(num_heads=4))
    read_checkpoint(nano_copy)  # config.json alone is consistent
    message = refusal(nano_copy, load=True)
    assert "memory tensor 'memt.layers.1.q_proj.weight' has shape [32, 64]" in message
    assert "[64, 64]" in message and "num_heads" in message


def test_memory_layers_not_matching_the_weights(nano_copy):
    edit_config(nano_copy, lambda c: c["memt"].update(memory_layers=[3]))
    message = refusal(nano_copy, load=True)
    assert "unexpected memory tensor(s)" in message and "memt.layers.1.A_log" in message


def test_missing_memory_tensor(nano_copy):
    edit_weights(nano_copy, lambda t: t.pop("memt.layers.3.dt_bias"))
    assert "missing memory tensor(s): memt.layers.3.dt_bias" in refusal(nano_copy, load=True)


def test_non_bf16_weights(nano_copy):
    edit_weights(nano_copy, lambda t: t.update({"lm_head.weight": t["lm_head.weight"].float()}))
    assert "tensor 'lm_head.weight' is F32; weights must be BF16" in refusal(nano_copy, load=True)


def test_fp8_weights_are_quantized(flash_copy):
    name = "memt.layers.0.v_proj.weight"
    edit_weights(flash_copy, lambda t: t.update({name: t[name].to(torch.float8_e4m3fn)}))
    assert f"tensor {name!r} is F8_E4M3: quantized weights are not served" in refusal(flash_copy, load=True)


@pytest.mark.parametrize(
    "family,where",
    [(NANO, ""), (NANO, "backbone_configs."), (NANO, "backbone_configs.text_config."), (FLASH, "")],
)
def test_quantization_config_is_refused(nano_copy, flash_copy, family, where):
    root = nano_copy if family == NANO else flash_copy

    def edit(config):
        target = config
        for key in filter(None, where.split(".")):
            target = target[key]
        target["quantization_config"] = {"quant_method": "fp8"}

    edit_config(root, edit)
    assert f"'{where}quantization_config' is set" in refusal(root)


@pytest.mark.parametrize("key", ["dtype", "torch_dtype"])
def test_non_bf16_dtype_in_config(nano_copy, key):
    edit_config(nano_copy, lambda c: c.update({key: "float32"}))
    assert f"'{key}' is 'float32'; weights must be bfloat16" in refusal(nano_copy)


def test_auto_map_is_refused(flash_copy):
    edit_config(flash_copy, lambda c: c.update(auto_map={"AutoModelForCausalLM": "modeling.MemT"}))
    assert "'auto_map'" in refusal(flash_copy)


def test_trust_remote_code_is_refused(nano_copy):
    edit_config(nano_copy, lambda c: c.update(trust_remote_code=True))
    assert "'trust_remote_code' is refused" in refusal(nano_copy)


# --------------------------------------------------------------------------- unknown keys: kept and reported


def test_unknown_memt_and_memt_runtime_keys_are_kept_and_reported(nano_checkpoint, nano_copy):
    """Released checkpoints may carry more than this version reads: kept, reported, never refused."""
    assert read_checkpoint(nano_checkpoint).unknown_keys == [] and read_checkpoint(nano_checkpoint).extra == {}

    def edit(config):
        config["memt"].update(window=4, notes={"trained_on": "web"})
        config["memt_runtime"].update(max_batch=8)

    edit_config(nano_copy, edit)
    checkpoint = read_checkpoint(nano_copy)
    assert checkpoint.unknown_keys == ["memt.notes", "memt.window", "memt_runtime.max_batch"]
    assert checkpoint.extra == {"memt": {"window": 4, "notes": {"trained_on": "web"}}, "memt_runtime": {"max_batch": 8}}
    # what this version reads is unchanged
    assert checkpoint.memory == read_checkpoint(nano_checkpoint).memory
    assert checkpoint.runtime == {"max_sessions_per_rank": 64, "max_inflight_commits_per_rank": 4, "min_kv_tokens": 256}
    assert RuntimeConfig.merge(checkpoint.runtime) == RuntimeConfig(64, 4, 256)


def test_known_fields_are_still_checked_beside_unknown_keys(nano_copy):
    edit_config(nano_copy, lambda c: c["memt"].update(window=4, update_rule="delta"))
    assert "memt.update_rule" in refusal(nano_copy)
    edit_config(nano_copy, lambda c: c["memt"].update(update_rule="gated_delta") or c["memt_runtime"].update(max_batch=0, min_kv_tokens=0))
    assert "'memt_runtime.min_kv_tokens' must be a positive integer" in refusal(nano_copy)


def test_a_checkpoint_with_unknown_keys_loads(nano_copy, nano_model):
    edit_config(nano_copy, lambda c: c["memt"].update(window=4))
    ids = torch.randint(0, 500, (1, 12), generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        assert torch.equal(load_model(nano_copy)(ids).logits, nano_model(ids).logits)


def test_unknown_memt_keys_enter_the_identity_and_runtime_keys_do_not(nano_checkpoint, nano_copy):
    """An unknown ``memt`` key may change the memory's meaning, so snapshots must not cross it."""
    plain = read_checkpoint(nano_checkpoint).identity()
    edit_config(nano_copy, lambda c: c["memt_runtime"].update(max_batch=8))
    assert read_checkpoint(nano_copy).identity() == plain
    edit_config(nano_copy, lambda c: c["memt"].update(window=4))
    with_window = read_checkpoint(nano_copy).identity()
    edit_config(nano_copy, lambda c: c["memt"].update(window=5))
    assert len({plain, with_window, read_checkpoint(nano_copy).identity()}) == 3


def test_dry_run_reports_unknown_keys(nano_checkpoint, nano_copy, capsys, caplog):
    from memt_core.launch import main

    assert main(["--model-path", str(nano_checkpoint), "--dry-run"]) == 0
    assert json.loads(capsys.readouterr().out)["unknown_config_keys"] == []
    edit_config(nano_copy, lambda c: c["memt"].update(window=4) or c["memt_runtime"].update(max_batch=8))
    assert main(["--model-path", str(nano_copy), "--dry-run"]) == 0
    assert json.loads(capsys.readouterr().out)["unknown_config_keys"] == ["memt.window", "memt_runtime.max_batch"]
    assert "memt.window, memt_runtime.max_batch" in caplog.text


@pytest.mark.parametrize("value", [0, -1, 1.5, "2", True, None])
@pytest.mark.parametrize("field", ["max_sessions_per_rank", "max_inflight_commits_per_rank", "min_kv_tokens"])
def test_memt_runtime_values_must_be_positive_integers(nano_copy, field, value):
    edit_config(nano_copy, lambda c: c["memt_runtime"].update({field: value}))
    assert f"'memt_runtime.{field}' must be a positive integer, got {value!r}" in refusal(nano_copy)


def test_memt_runtime_must_be_an_object(flash_copy):
    edit_config(flash_copy, lambda c: c.update(memt_runtime=[1]))
    assert "'memt_runtime' must be an object" in refusal(flash_copy)


@pytest.mark.parametrize("value", ["", "   ", 7])
def test_memt_checkpoint_id_must_be_a_nonempty_string(nano_copy, value):
    edit_config(nano_copy, lambda c: c.update(memt_checkpoint_id=value))
    assert "'memt_checkpoint_id' must be a nonempty string" in refusal(nano_copy)


def test_invalid_backbone_configuration(flash_copy):
    edit_config(flash_copy, lambda c: c.pop("hidden_size"))
    assert "backbone field 'hidden_size' is required" in refusal(flash_copy)


# --------------------------------------------------------------------------- runtime configuration


def test_runtime_defaults_are_one():
    assert RuntimeConfig.merge() == RuntimeConfig(1, 1, 1)


def test_runtime_merge_order():
    """defaults → checkpoint → JSON override → explicit values; each later source wins per field."""
    checkpoint = {"max_sessions_per_rank": 64, "max_inflight_commits_per_rank": 4}
    override = parse_override_args('{"memt_runtime": {"max_inflight_commits_per_rank": 8, "min_kv_tokens": 512}}')
    assert override == {"max_inflight_commits_per_rank": 8, "min_kv_tokens": 512}
    assert RuntimeConfig.merge(checkpoint) == RuntimeConfig(64, 4, 1)
    assert RuntimeConfig.merge(checkpoint, override) == RuntimeConfig(64, 8, 512)
    explicit = {"max_sessions_per_rank": None, "max_inflight_commits_per_rank": None, "min_kv_tokens": 1024}
    assert RuntimeConfig.merge(checkpoint, override, explicit) == RuntimeConfig(64, 8, 1024)
    assert RuntimeConfig.merge(checkpoint, override, {"max_sessions_per_rank": 2}) == RuntimeConfig(2, 8, 512)
    assert RuntimeConfig.merge(None, None, {"min_kv_tokens": 3}) == RuntimeConfig(1, 1, 3)


def test_runtime_merge_with_the_checkpoint_values(nano_checkpoint):
    runtime = read_checkpoint(nano_checkpoint).runtime
    merged = RuntimeConfig.merge(runtime, parse_override_args('{"memt_runtime": {"max_sessions_per_rank": 3}}'))
    assert merged == RuntimeConfig(max_sessions_per_rank=3, max_inflight_commits_per_rank=4, min_kv_tokens=256)


def test_runtime_merge_refuses_bad_values():
    """Values an operator passes (flags, JSON overrides) are refused when unknown, unlike a checkpoint's."""
    with pytest.raises(CheckpointError, match="unknown runtime field 'max_batch'"):
        RuntimeConfig.merge(explicit={"max_batch": 3})
    with pytest.raises(CheckpointError, match="--min-kv-tokens: 'min_kv_tokens' must be a positive integer"):
        RuntimeConfig.merge(explicit={"min_kv_tokens": 0})
    with pytest.raises(CheckpointError, match="checkpoint: unknown field"):
        RuntimeConfig.merge(checkpoint={"slots": 1})


@pytest.mark.parametrize("text", [None, ""])
def test_no_override_args(text):
    assert parse_override_args(text) == {}


@pytest.mark.parametrize(
    "text,message",
    [
        ('{"memt": {"chunk_tokens": 8}}', "accepts only {\"memt_runtime\""),
        ('{"memt_runtime": {}, "hidden_size": 8}', "got keys: hidden_size, memt_runtime"),
        ("[1]", "accepts only"),
        ("{bad json", "is not valid JSON"),
        ('{"memt_runtime": {"min_kv_tokens": -5}}', "'memt_runtime.min_kv_tokens' must be a positive integer"),
        ('{"memt_runtime": {"slots": 1}}', "unknown field(s) in 'memt_runtime': slots"),
        ('{"memt_runtime": 4}', "'memt_runtime' must be an object"),
    ],
)
def test_override_args_refusals(text, message):
    with pytest.raises(CheckpointError) as info:
        parse_override_args(text)
    assert message in str(info.value)
    assert "--json-model-override-args" in str(info.value)


# --------------------------------------------------------------------------- identities


def test_config_sha256_is_of_the_exact_bytes(nano_copy):
    before = read_checkpoint(nano_copy)
    assert before.config_sha256 == hashlib.sha256((nano_copy / "config.json").read_bytes()).hexdigest()
    config = json.loads((nano_copy / "config.json").read_bytes())
    raw = json.dumps(config, separators=(",", ":")).encode()  # same JSON, other bytes
    (nano_copy / "config.json").write_bytes(raw)
    after = read_checkpoint(nano_copy)
    assert after.config_sha256 == hashlib.sha256(raw).hexdigest() != before.config_sha256
    assert after.identity() == before.identity()  # the identity is over content, not bytes


def test_identity_does_not_depend_on_the_location(nano_checkpoint, nano_copy):
    assert read_checkpoint(nano_copy).identity() == read_checkpoint(nano_checkpoint).identity()


def test_nano_and_flash_identities_differ(nano_checkpoint, flash_checkpoint):
    assert read_checkpoint(nano_checkpoint).identity() != read_checkpoint(flash_checkpoint).identity()


def test_identity_changes_with_the_chat_template(nano_copy):
    before = read_checkpoint(nano_copy).identity()
    template = nano_copy / "chat_template.jinja"
    template.write_text(template.read_text() + "{# changed #}")
    assert read_checkpoint(nano_copy).identity() != before


def test_identity_changes_with_the_vocabulary(nano_copy):
    before = read_checkpoint(nano_copy).identity()
    tokenizer = json.loads((nano_copy / "tokenizer.json").read_text(encoding="utf-8"))
    vocab = tokenizer["model"]["vocab"]
    first, second = sorted(vocab, key=vocab.get)[-2:]
    vocab[first], vocab[second] = vocab[second], vocab[first]  # same tokens, other ids
    (nano_copy / "tokenizer.json").write_text(json.dumps(tokenizer), encoding="utf-8")
    assert read_checkpoint(nano_copy).identity() != before


def test_identity_changes_with_the_added_tokens(flash_copy):
    before = read_checkpoint(flash_copy).identity()
    tokenizer = json.loads((flash_copy / "tokenizer.json").read_text(encoding="utf-8"))
    tokenizer["added_tokens"][0]["content"] = "<|other|>"
    (flash_copy / "tokenizer.json").write_text(json.dumps(tokenizer), encoding="utf-8")
    assert read_checkpoint(flash_copy).identity() != before


def test_identity_changes_with_the_flash_encoder(flash_copy):
    before = read_checkpoint(flash_copy).identity()
    with open(flash_copy / "encoding_dsv4.py", "a", encoding="utf-8") as handle:
        handle.write("\n# changed\n")
    assert read_checkpoint(flash_copy).identity() != before


@pytest.mark.parametrize(
    "edit",
    [
        lambda c: c["memt"].update(chunk_tokens=64),
        lambda c: c["backbone_configs"]["text_config"].update(initializer_range=0.1),
    ],
    ids=["memt", "backbone"],
)
def test_identity_changes_with_the_model_config(nano_copy, edit):
    before = read_checkpoint(nano_copy).identity()
    edit_config(nano_copy, edit)
    assert read_checkpoint(nano_copy).identity() != before


def test_identity_ignores_the_runtime_limits(nano_copy):
    before = read_checkpoint(nano_copy).identity()
    edit_config(nano_copy, lambda c: c["memt_runtime"].update(max_sessions_per_rank=2))
    assert read_checkpoint(nano_copy).identity() == before


def test_describe(nano_checkpoint):
    checkpoint = read_checkpoint(nano_checkpoint)
    assert checkpoint.describe() == {
        "model": NANO,
        "model_type": "memt_qwen3_5_moe",
        "config_sha256": hashlib.sha256((nano_checkpoint / "config.json").read_bytes()).hexdigest(),
        "checkpoint_id": "tiny-random-nano",
        "identity": checkpoint.identity(),
    }
    assert len(checkpoint.identity()) == 64 and int(checkpoint.identity(), 16) >= 0


# --------------------------------------------------------------------------- weights


def test_missing_backbone_tensor(nano_copy):
    edit_weights(nano_copy, lambda t: t.pop("model.norm.weight"))
    assert "missing tensor(s): model.norm.weight" in refusal(nano_copy, load=True)


def test_unexpected_backbone_tensor(flash_copy):
    edit_weights(flash_copy, lambda t: t.update({"model.layers.0.extra.weight": torch.zeros(4, dtype=torch.bfloat16)}))
    assert "unexpected tensor(s): model.layers.0.extra.weight" in refusal(flash_copy, load=True)


def test_backbone_tensor_of_the_wrong_shape(nano_copy):
    edit_weights(nano_copy, lambda t: t.update({"model.norm.weight": torch.zeros(65, dtype=torch.bfloat16)}))
    assert "tensor 'model.norm.weight' has shape [65]; the configuration gives [64]" in refusal(nano_copy, load=True)


def test_no_weights(nano_copy):
    (nano_copy / SINGLE_FILE).unlink()
    assert "has no .safetensors weights" in refusal(nano_copy, load=True)


def test_sharded_checkpoint_gives_the_same_logits(tmp_path, nano_checkpoint, nano_model):
    from memt_core.tiny import make_tiny_checkpoint

    sharded = make_tiny_checkpoint(tmp_path / "sharded", NANO, max_shard_bytes=20000)
    index = json.loads((sharded / INDEX_FILE).read_text())
    shards = sorted(set(index["weight_map"].values()))
    assert len(shards) > 1 and not (sharded / SINGLE_FILE).exists()
    assert set(index["weight_map"]) == set(load_file(str(nano_checkpoint / SINGLE_FILE)))
    model = load_model(sharded)
    ids = torch.randint(0, 500, (2, 24), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        assert torch.equal(model(ids).logits, nano_model(ids).logits)

    (sharded / shards[-1]).unlink()
    with pytest.raises(CheckpointError, match=f"names missing shard\\(s\\): {shards[-1]}"):
        load_model(sharded)
