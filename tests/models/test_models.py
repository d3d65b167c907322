"""MemT models: the wrapped backbone is transformers' own, unchanged; memory modules read and write.

The pin of DESIGN §4: with empty memory a MemT model's logits are exactly the backbone's logits for
the same weights, built from transformers' class and the checkpoint's tensors.
"""

from __future__ import annotations

import shutil

import pytest
import torch
from safetensors.torch import load_file

from memt_core.checkpoint import MEMORY_PREFIX, backbone_config, read_checkpoint
from memt_core.families import FLASH, NANO, SMOL
from memt_core.inference import commit_tokens, memory_batch
from memt_core.memory.state import MemoryState
from memt_core.models.memory import MemoryModule, WriteInputs
from memt_core.models.weights import SINGLE_FILE, load_model, memory_tensor_shapes, save_weights


def plain_backbone(root):
    """transformers' own causal LM for the checkpoint, with its backbone tensors in FP32."""
    from transformers import DeepseekV4ForCausalLM, LlamaForCausalLM, Qwen3_5MoeForCausalLM

    checkpoint = read_checkpoint(root)
    config = backbone_config(checkpoint)
    if checkpoint.model == NANO:
        model_class = Qwen3_5MoeForCausalLM
    elif checkpoint.model == SMOL:
        model_class = LlamaForCausalLM
    else:
        model_class = DeepseekV4ForCausalLM
        config._attn_implementation = "eager"  # as memt_core.models.weights.build_backbone does
    model = model_class(config).float()
    tensors = {
        name: tensor.float() if tensor.is_floating_point() else tensor
        for name, tensor in load_file(str(root / SINGLE_FILE)).items()
        if not name.startswith("memt.")
    }
    result = model.load_state_dict(tensors, strict=True)
    assert not result.missing_keys and not result.unexpected_keys
    return model.eval()


def token_ids(batch: int, length: int, seed: int = 0) -> torch.Tensor:
    return torch.randint(0, 500, (batch, length), generator=torch.Generator().manual_seed(seed))


def zero_memory(model, batch: int) -> dict[int, torch.Tensor]:
    shape = model.checkpoint.memory.state_shape()
    return {layer: torch.zeros(batch, *shape[1:]) for layer in model.memory_layers}


def random_memory(model, batch: int, seed: int = 0) -> dict[int, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    shape = model.checkpoint.memory.state_shape()
    return {layer: torch.randn(batch, *shape[1:], generator=gen) for layer in model.memory_layers}


@pytest.mark.parametrize("family", [NANO, FLASH, SMOL])
def test_empty_memory_logits_equal_the_plain_backbone(family, request):
    name = {NANO: "nano", FLASH: "flash", SMOL: "smol"}[family]
    root, model = request.getfixturevalue(f"{name}_checkpoint"), request.getfixturevalue(f"{name}_model")
    plain = plain_backbone(root)
    ids = token_ids(2, 40)
    with torch.no_grad():
        expected = plain(input_ids=ids).logits
        assert torch.equal(model(ids).logits, expected)
        assert torch.equal(model(ids, memory=memory_batch(model, [MemoryState(), None])).logits, expected)
        # an all-zero memory adds exactly zero: the read path has no bias
        assert torch.equal(model(ids, memory=zero_memory(model, 2)).logits, expected)
        # and a nonzero memory does change them (the check above is not vacuous)
        assert not torch.allclose(model(ids, memory=random_memory(model, 2)).logits, expected)


def test_memory_is_read_per_row(tiny_model):
    """Row 0 reads zeros, row 1 a random memory: row 0's logits are those without memory.

    Not bit-exact: the MoE layers group tokens of both rows per expert, so row 1 changes the shapes
    of the expert matmuls that row 0's tokens go through.
    """
    ids = token_ids(2, 16, seed=1)
    memory = random_memory(tiny_model, 2, seed=2)
    for layer in memory:
        memory[layer][0] = 0
    with torch.no_grad():
        without = tiny_model(ids).logits
        mixed = tiny_model(ids, memory=memory).logits
    torch.testing.assert_close(mixed[0], without[0], rtol=1e-5, atol=1e-5)
    assert (mixed[1] - without[1]).abs().max() > 1e-2


def test_each_memory_layer_is_read(nano_model):
    """A memory in only one layer still changes the logits, and differently for each layer."""
    ids = token_ids(1, 12, seed=3)
    memory = random_memory(nano_model, 1, seed=4)
    with torch.no_grad():
        without = nano_model(ids).logits
        logits = {layer: nano_model(ids, memory={layer: memory[layer]}).logits for layer in nano_model.memory_layers}
    for layer, value in logits.items():
        assert not torch.allclose(value, without), f"memory layer {layer} is not read"
    first, second = logits.values()
    assert not torch.allclose(first, second)


def test_memory_read_is_causal(tiny_model):
    """Memory reads add per token: logits of a prefix do not depend on the tokens after it."""
    ids = token_ids(1, 20, seed=5)
    memory = random_memory(tiny_model, 1, seed=6)
    with torch.no_grad():
        full = tiny_model(ids, memory=memory).logits
        prefix = tiny_model(ids[:, :12], memory=memory).logits
    torch.testing.assert_close(prefix, full[:, :12], rtol=1e-5, atol=1e-5)


def test_collect_writes(tiny_model):
    memory = tiny_model.checkpoint.memory
    ids = token_ids(2, 9, seed=7)
    with torch.no_grad():
        plain = tiny_model(ids)
        out = tiny_model(ids, collect_writes=True)
    assert plain.writes == {}
    assert torch.equal(out.logits, plain.logits)  # collecting changes nothing
    assert sorted(out.writes) == list(memory.memory_layers)
    for writes in out.writes.values():
        assert isinstance(writes, WriteInputs) and writes.length == 9
        assert writes.k.shape == (2, 9, memory.num_heads, memory.key_dim)
        assert writes.v.shape == (2, 9, memory.num_heads, memory.value_dim)
        assert writes.g.shape == writes.beta.shape == (2, 9, memory.num_heads)
        assert all(t.dtype == torch.float32 for t in (writes.k, writes.v, writes.g, writes.beta))
        torch.testing.assert_close(writes.k.norm(dim=-1), torch.ones(2, 9, memory.num_heads))
        assert (writes.g <= 0).all() and ((writes.beta > 0) & (writes.beta < 1)).all()


def test_a_deep_copy_reads_and_writes_its_own_memory(tiny_model):
    """``copy.deepcopy`` of a model (as a trainer copies one to another device) hooks the copy: it reads memory and
    collects writes like the original, and changing the copy's memory weights changes only the copy."""
    import copy

    ids = token_ids(1, 10, seed=9)
    memory = random_memory(tiny_model, 1, seed=10)
    twin = copy.deepcopy(tiny_model)
    with torch.no_grad():
        original, copied = tiny_model(ids, memory=memory, collect_writes=True), twin(ids, memory=memory, collect_writes=True)
        torch.testing.assert_close(copied.logits, original.logits)
        assert sorted(copied.writes) == sorted(original.writes) == list(tiny_model.memory_layers)
        assert not torch.allclose(copied.logits, twin(ids).logits)  # the copy reads the memory it is given
        for layer in twin.memory_layers:
            twin.memory_module(layer).o_proj.weight.mul_(3.0)
        assert not torch.allclose(twin(ids, memory=memory).logits, copied.logits)
        torch.testing.assert_close(tiny_model(ids, memory=memory).logits, original.logits)


def test_write_inputs_slice_and_mask():
    gen = torch.Generator().manual_seed(8)
    writes = WriteInputs(*(torch.randn(shape, generator=gen) for shape in [(2, 5, 3, 4), (2, 5, 3, 6), (2, 5, 3), (2, 5, 3)]))
    piece = writes.slice(1, 4)
    assert piece.length == 3 and torch.equal(piece.v, writes.v[:, 1:4])
    mask = torch.tensor([[True, True, True, False, False], [True] * 5])
    masked = writes.masked(mask)
    for name in ("k", "v", "g", "beta"):
        value, original = getattr(masked, name), getattr(writes, name)
        assert torch.equal(value[1], original[1]) and torch.equal(value[0, :3], original[0, :3])
        assert (value[0, 3:] == 0).all(), name


def test_memory_module_projections_have_no_bias():
    module = MemoryModule(hidden_size=32, num_heads=2, key_dim=8, value_dim=4)
    module.reset_parameters(std=0.5)
    assert all("bias" not in name for name, _ in module.named_parameters() if name != "dt_bias")
    x = torch.randn(1, 5, 32)
    assert torch.equal(module.read(x, torch.zeros(1, 2, 8, 4)), torch.zeros(1, 5, 32))
    assert module.read(x, torch.randn(1, 2, 8, 4)).abs().max() > 0


def test_memory_module_write_inputs_follow_the_design():
    """k = l2norm(W_k x), v = W_v x, β = σ(W_β x), log α = −exp(A_log)·softplus(W_α x + dt_bias)."""
    module = MemoryModule(hidden_size=16, num_heads=2, key_dim=4, value_dim=3)
    module.reset_parameters(std=0.5)
    with torch.no_grad():
        module.A_log.copy_(torch.tensor([0.5, -1.0]))
        module.dt_bias.copy_(torch.tensor([0.1, -0.2]))
    x = torch.randn(1, 3, 16)
    writes = module.write_inputs(x)
    k = (x @ module.k_proj.weight.T).view(1, 3, 2, 4)
    torch.testing.assert_close(writes.k, k / k.norm(dim=-1, keepdim=True))
    torch.testing.assert_close(writes.v, (x @ module.v_proj.weight.T).view(1, 3, 2, 3))
    torch.testing.assert_close(writes.beta, torch.sigmoid(x @ module.b_proj.weight.T))
    softplus = torch.log1p(torch.exp(x @ module.a_proj.weight.T + module.dt_bias))
    torch.testing.assert_close(writes.g, -module.A_log.exp() * softplus)


def test_checkpoint_state_dict_names(tiny_model):
    names = set(tiny_model.checkpoint_state_dict())
    memory = {name for name in names if name.startswith(MEMORY_PREFIX)}
    assert memory == set(memory_tensor_shapes(tiny_model.checkpoint))
    assert "lm_head.weight" in names and not any(name.startswith("backbone.") for name in names)
    assert names - memory == set(tiny_model.backbone.state_dict())


def test_save_weights_then_load_gives_the_same_model(tmp_path, nano_checkpoint, nano_model):
    """save_weights writes BF16 (the model was loaded from BF16, so FP32 → BF16 is exact) and names as stored."""
    root = tmp_path / "resaved"
    shutil.copytree(nano_checkpoint, root)
    (root / SINGLE_FILE).unlink()
    save_weights(nano_model, root, max_shard_bytes=50000)
    reloaded = load_model(root)
    ids = token_ids(1, 30, seed=9)
    memory = commit_tokens(nano_model, MemoryState(), list(range(40))).memory
    with torch.no_grad():
        for read in (None, memory_batch(nano_model, [memory])):
            assert torch.equal(reloaded(ids, memory=read).logits, nano_model(ids, memory=read).logits)


def test_load_model_in_bfloat16(nano_checkpoint, nano_model):
    model = load_model(nano_checkpoint, dtype=torch.bfloat16)
    assert next(model.parameters()).dtype == torch.bfloat16
    assert torch.equal(model.memory_module(1).q_proj.weight.float(), nano_model.memory_module(1).q_proj.weight)
    ids = token_ids(1, 10, seed=10)
    with torch.no_grad():
        logits = model(ids).logits
        reference = nano_model(ids).logits
    assert logits.dtype == torch.bfloat16
    logits = logits.float()
    assert torch.isfinite(logits).all()
    # BF16 rounding can flip a MoE routing decision of the random model: compare the logits as a whole
    assert torch.nn.functional.cosine_similarity(logits.flatten(), reference.flatten(), dim=0) > 0.95
