"""The parallel plan (``memt_core.parallel.plan``): SGLang's settings checked against a checkpoint's head and expert
counts before anything is loaded, one line per refusal, and what each rank holds."""

from __future__ import annotations

import pytest
import torch

from memt_core import families
from memt_core.errors import CheckpointError
from memt_core.parallel import Parallel, check, rank_shares, share, split_of

NANO = families.get(families.NANO)
FLASH = families.get(families.FLASH)
#: Nano-shaped counts (the released model's heads; 256 experts)
NANO_BACKBONE = {"num_attention_heads": 16, "num_key_value_heads": 2, "linear_num_key_heads": 16, "linear_num_value_heads": 32,
                 "num_experts": 256, "moe_intermediate_size": 512, "shared_expert_intermediate_size": 512, "vocab_size": 248320}
FLASH_BACKBONE = {"num_attention_heads": 64, "n_routed_experts": 256, "moe_intermediate_size": 2048, "vocab_size": 129280}


def checked(parallel: Parallel, family=NANO, backbone=None, *, memory_heads: int = 16, device: str = "cpu", gpus=None, **kw) -> None:
    backbone = backbone if backbone is not None else (NANO_BACKBONE if family is NANO else FLASH_BACKBONE)
    check(parallel, backbone=backbone, memory_heads=memory_heads, family=family, device=device, visible_gpus=gpus, **kw)


def test_the_seeds_settings_pass():
    checked(Parallel(tp=2))  # Nano: TP/EP/DP 2/1/1
    checked(Parallel(tp=8, ep=8, dp=8, dp_attention=True), FLASH)  # Flash: 8/8/8 with DP attention
    checked(Parallel(tp=8, ep=8, dp=8, dp_attention=True), FLASH, device="cuda", gpus=8)
    checked(Parallel(tp=4, ep=2))  # experts over 2 ranks, each expert's intermediate over the other 2
    checked(Parallel(tp=4))  # 2 KV heads over 4 ranks: replicated


@pytest.mark.parametrize("parallel, family, backbone, message", [
    (Parallel(tp=2, dp=2, dp_attention=True), NANO, None, "memt-nano is served with DP attention off"),
    (Parallel(tp=8, ep=8, dp=4, dp_attention=True), FLASH, None, "--enable-dp-attention needs --tp-size equal to --dp-size"),
    (Parallel(tp=2), FLASH, None, "memt-flash's attention is not split across ranks"),
    (Parallel(tp=2, dp=2), NANO, None, "--dp-size 2 without --enable-dp-attention"),
    (Parallel(tp=4, ep=3), NANO, None, r"--ep-size \(3\) must divide --tp-size \(4\)"),
    (Parallel(tp=4, ep=4), NANO, {**NANO_BACKBONE, "num_experts": 6}, r"--ep-size \(4\) must divide the expert count \(6\)"),
    (Parallel(tp=2, ep=2), NANO, {"num_attention_heads": 4, "vocab_size": 512}, "no routed experts"),
    (Parallel(tp=3), NANO, {"num_attention_heads": 16, "vocab_size": 512 * 3}, r"must divide the attention heads \(16"),
    (Parallel(tp=4), NANO, {**NANO_BACKBONE, "num_key_value_heads": 6, "num_attention_heads": 12}, "KV head count"),
    (Parallel(tp=2), NANO, {**NANO_BACKBONE, "linear_num_key_heads": 3}, "linear-attention key heads"),
    (Parallel(tp=4), NANO, {**NANO_BACKBONE, "moe_intermediate_size": 510}, "routed experts' intermediate size"),
    (Parallel(tp=4), NANO, {**NANO_BACKBONE, "vocab_size": 1002}, "vocabulary"),
    (Parallel(tp=2, backend="nccl"), NANO, None, "--dist-backend nccl needs CUDA"),
    (Parallel(tp=0), NANO, None, "--tp-size must be at least 1"),
])
def test_refusals_are_one_line_naming_the_flag(parallel, family, backbone, message):
    with pytest.raises(CheckpointError, match=message) as refused:
        checked(parallel, family, backbone)
    assert "\n" not in str(refused.value)


def test_memory_heads_and_devices_and_determinism():
    with pytest.raises(CheckpointError, match=r"latent-memory heads \(2"):
        checked(Parallel(tp=4), memory_heads=2)
    with pytest.raises(CheckpointError, match="--tp-size 2 needs 2 GPUs, one per rank; 1 visible"):
        checked(Parallel(tp=2), device="cuda", gpus=1)
    with pytest.raises(CheckpointError, match="--deterministic-communication is for multi-rank engines"):
        checked(Parallel(), deterministic_communication=True)
    checked(Parallel(tp=2), deterministic_communication=True)
    assert Parallel(tp=2).backend_for("cuda") == "nccl" and Parallel(tp=2).backend_for("cpu") == "gloo"
    assert Parallel(tp=2, backend="gloo").backend_for("cuda") == "gloo"


def test_every_tensor_of_both_tiny_families_has_its_rule(nano_checkpoint, flash_checkpoint):
    from memt_core.checkpoint import read_checkpoint
    from memt_core.models.weights import scan_weights

    nano = scan_weights(read_checkpoint(nano_checkpoint))
    kinds = {name: split_of(name) for name in nano}
    assert kinds["model.layers.1.self_attn.q_proj.weight"] == ("attention", 0)
    assert kinds["model.layers.1.self_attn.k_proj.weight"] == ("kv", 0)
    assert kinds["model.layers.1.self_attn.o_proj.weight"] == ("attention", 1)
    assert kinds["model.layers.0.linear_attn.conv1d.weight"] == ("attention", 0)
    assert kinds["model.layers.0.linear_attn.A_log"] == ("attention", 0)
    assert kinds["model.layers.0.linear_attn.out_proj.weight"] == ("attention", 1)
    assert kinds["memt.layers.1.g_proj.weight"] == ("attention", 0) and kinds["memt.layers.1.o_proj.weight"] == ("attention", 1)
    assert kinds["model.layers.0.mlp.experts.gate_up_proj"] == ("experts", 0)
    assert kinds["model.layers.0.mlp.shared_expert.down_proj.weight"] == ("dense", 1)
    assert kinds["lm_head.weight"] == ("vocab", 0) and kinds["model.embed_tokens.weight"] is None  # a token reads one row
    replicated = sorted(name for name, kind in kinds.items() if kind is None)
    assert all(name.endswith(("norm.weight", "mlp.gate.weight", "shared_expert_gate.weight", "embed_tokens.weight"))
               for name in replicated), replicated
    flash = scan_weights(read_checkpoint(flash_checkpoint))
    assert split_of("model.layers.0.self_attn.q_b_proj.weight") is None  # Flash's attention stays whole (attention TP 1)
    assert {split_of(name) for name in flash if ".experts." in name} == {("experts", 0)}


def test_each_rank_holds_its_share(nano_checkpoint):
    from memt_core.checkpoint import read_checkpoint
    from memt_core.models.weights import scan_weights

    checkpoint = read_checkpoint(nano_checkpoint)
    header = scan_weights(checkpoint)
    one = rank_shares(header, Parallel(), backbone=checkpoint.backbone, memory_heads=2, device="cpu")
    two = rank_shares(header, Parallel(tp=2), backbone=checkpoint.backbone, memory_heads=2, device="cpu")
    assert len(one) == 1 and one[0]["weights_gb"] == one[0]["of_gb"]
    assert [r["holds"]["attention heads"] for r in two] == ["0-1 of 4", "2-3 of 4"]
    assert [r["holds"]["latent-memory heads"] for r in two] == ["0 of 2", "1 of 2"]
    # everything but the embedding, the norms and the routers is halved
    size = {name: 2 * torch.Size(shape).numel() for name, (_, shape) in header.items()}  # BF16
    whole = [name for name in header if name.endswith(("embed_tokens.weight", "norm.weight", "mlp.gate.weight", "shared_expert_gate.weight"))]
    expected = (sum(size.values()) + sum(size[name] for name in whole)) / 2
    assert two[0]["weights_gb"] == pytest.approx(expected / 1e9, abs=2e-6) and two[0]["of_gb"] == pytest.approx(sum(size.values()) / 1e9, abs=2e-6)
    assert share("model.layers.1.self_attn.k_proj.weight", Parallel(tp=4), kv_heads=2) == 0.5  # replicated KV heads
    assert share("model.layers.0.mlp.experts.down_proj", Parallel(tp=4, ep=2)) == 0.25


def test_the_plan_and_the_step_record_import_no_torch():
    """The launcher checks the plan before loading anything; a step record is plain data a rank is sent."""
    import subprocess
    import sys

    code = ("import sys, memt_core.parallel.plan, memt_core.engine.step, memt_core.engine.base; "
            "assert 'torch' not in sys.modules, 'torch was imported'")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr


def test_each_family_names_its_split_and_one_without_is_served_on_one_rank():
    """``Family.tensor_split`` (beside ``decode_step`` and ``kernels``): the rules its sharded loader reads by."""
    from memt_core.families.base import Family, resolve

    assert resolve(NANO.tensor_split) is split_of and resolve(FLASH.tensor_split) is split_of
    assert Family.tensor_split is None  # a family must name its split to be served on several ranks

    class OneRank:
        name, dp_attention, shards_attention, tensor_split = "one-rank", False, True, None

    checked(Parallel(), OneRank)
    with pytest.raises(CheckpointError, match="one-rank is served on one rank only"):
        checked(Parallel(tp=2), OneRank)
