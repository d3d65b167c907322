"""Random Nano checkpoints at the released model's widths (``--widths nano``): what the GPU benches run.

The configuration is checked in full (and its parameter count on the meta device, no memory); one
checkpoint is written and loaded at the widths with fewer experts, to keep the test to seconds.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import torch

from memt_core.checkpoint import read_checkpoint
from memt_core.families import FLASH, NANO

REPO = Path(__file__).resolve().parents[2]


def meta_model(checkpoint):
    from memt_core.models.memt import MemTForCausalLM
    from memt_core.models.weights import build_backbone

    with torch.device("meta"):
        return MemTForCausalLM(checkpoint, build_backbone(checkpoint))


def test_the_nano_widths_are_the_released_models_with_fewer_layers_and_experts(tmp_path):
    from memt_core.tiny import write_config

    checkpoint = read_checkpoint(write_config(tmp_path / "nano", NANO, widths="nano", chunk_tokens=2048))
    text = checkpoint.backbone
    assert (text["hidden_size"], text["num_attention_heads"], text["num_key_value_heads"], text["head_dim"]) == (2048, 16, 2, 256)
    assert (text["linear_num_key_heads"], text["linear_num_value_heads"], text["linear_key_head_dim"], text["linear_value_head_dim"]) == (16, 32, 128, 128)
    assert (text["num_experts"], text["num_experts_per_tok"], text["moe_intermediate_size"], text["shared_expert_intermediate_size"]) == (32, 8, 512, 512)
    assert text["layer_types"] == ["linear_attention"] * 3 + ["full_attention"]
    memory = checkpoint.memory
    assert (memory.memory_layers, memory.num_heads, memory.key_dim, memory.value_dim, memory.chunk_tokens) == ((3,), 16, 128, 128, 2048)
    model = meta_model(checkpoint)
    total = sum(p.numel() for p in model.parameters())
    experts = sum(p.numel() for name, p in model.named_parameters() if ".experts." in name)
    assert total == 567_077_984  # issue 46's 567 M
    assert round((total - experts + experts * 8 / 32) / 1e6) == 265  # active per token: top-8 of 32

    eight = read_checkpoint(write_config(tmp_path / "eight", NANO, widths="nano", layers=8, experts=256))
    assert eight.backbone["layer_types"] == (["linear_attention"] * 3 + ["full_attention"]) * 2
    assert eight.memory.memory_layers == (3, 7) and eight.backbone["num_experts"] == 256


@pytest.mark.parametrize(
    "kwargs, message",
    [({"layers": 6}, "multiple of 4"), ({"experts": 4}, "at least the 8"), ({"layers": 0}, "multiple of 4")],
)
def test_impossible_nano_widths_are_refused(tmp_path, kwargs, message):
    from memt_core.tiny import write_config

    with pytest.raises(ValueError, match=message):
        write_config(tmp_path / "bad", NANO, widths="nano", **kwargs)


def test_families_without_named_widths_say_so(tmp_path):
    from memt_core.tiny import write_config

    with pytest.raises(ValueError, match="memt-flash has no 'nano' widths"):
        write_config(tmp_path / "flash", FLASH, widths="nano")
    with pytest.raises(ValueError, match="name other widths"):
        write_config(tmp_path / "tiny", NANO, experts=8)


def test_the_builder_writes_a_nano_widths_checkpoint_that_loads_and_runs(tmp_path):
    """Through the script, as gpu.sh runs it (8 experts instead of 32: the same widths in a third of the bytes)."""
    from memt_core.models.weights import load_model

    path = tmp_path / "nano-widths"
    done = subprocess.run(
        [sys.executable, str(REPO / "scripts/make_tiny_checkpoint.py"), str(path), "--widths", "nano", "--layers", "4", "--experts", "8"],
        cwd=REPO, capture_output=True, text=True, timeout=300,
    )
    assert done.returncode == 0, done.stderr
    assert "nano widths" in done.stdout
    model = load_model(path, dtype=torch.bfloat16)
    assert model.checkpoint.memory.chunk_tokens == 2048 and model.memory_layers == (3,)
    assert model.backbone.model.layers[0].mlp.experts.gate_up_proj.shape == (8, 1024, 2048)
    with torch.no_grad():
        logits = model(torch.tensor([[5, 6, 7, 8]]), logits_to_keep=1).logits
    assert logits.shape == (1, 1, model.config.vocab_size) and torch.isfinite(logits).all()
