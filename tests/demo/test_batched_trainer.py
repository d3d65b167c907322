"""The batched trainer (``memt_demo.batched``) computes the reference trainer's loss and gradients.

A tiny model of the demo's architecture (the bundled tokenizer, 2 layers of width 32, memory on both, write
events of 16 tokens so commits span several) and seeded batches of the full mix: episodes with no commit,
with a few and with many, documents in several pieces, commits of different lengths at the same index, so
padding, rows that ended and multi-event writes are all exercised. The batched path must agree with
``memt_demo.train.episode_loss`` in loss, statistics and every parameter's gradient; with the padding's
writes left unmasked it must not.
"""

from __future__ import annotations

import shutil
from collections import Counter

import pytest
import torch

from memt_demo import BUNDLED_MODEL

RTOL = 1e-4  # FP32; only the order of sums differs (measured ≈ 2e-6 on the demo model's shape)


def assert_close(name: str, reference: torch.Tensor, actual: torch.Tensor, rtol: float = RTOL) -> None:
    """Largest absolute difference relative to the reference's largest magnitude."""
    scale = reference.abs().max().clamp(min=1e-12)
    error = float((reference - actual).abs().max() / scale)
    assert error <= rtol, f"{name}: relative difference {error:.2e} > {rtol:.0e}"


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    import json

    from transformers import PreTrainedTokenizerFast

    from memt_demo.format import DemoChatFormat
    from memt_demo.train import SKELETON_FILES, ModelShape, TrainConfig, demo_config, init_model

    directory = tmp_path_factory.mktemp("tiny-demo")
    for name in SKELETON_FILES[1:]:
        shutil.copyfile(BUNDLED_MODEL / name, directory / name)
    tokenizer = PreTrainedTokenizerFast.from_pretrained(str(directory))
    shape = ModelShape(hidden_size=32, layers=2, heads=2, kv_heads=1, head_dim=16, experts=4, experts_per_token=2,
                       expert_size=32, shared_expert_size=32, memory_layers=(0, 1), memory_heads=2, key_dim=8,
                       value_dim=8, chunk_tokens=16)
    (directory / "config.json").write_text(json.dumps(demo_config(tokenizer, shape)))
    model = init_model(directory, TrainConfig(shape=shape)).train()
    return model, DemoChatFormat(tokenizer, value_weight=3.0)


def draw_batch(fmt, seed: int, size: int = 8):
    from memt_demo.episodes import EpisodeSampler, Mix

    sampler = EpisodeSampler(seed)
    mix = Mix(min_chatter=2, max_chatter=6)  # long conversations, kept short so the test runs in seconds
    batch = [fmt.episode(sampler.sample(mix), 16, reply_weight=0.5) for _ in range(size)]
    counts = [len(e.commits) for e in batch]
    # what makes the comparison meaningful: rows that end early, padding at one commit index, multi-event commits
    assert len(set(counts)) >= 3 and min(counts) <= 1, counts
    assert len({len(e.commits[0]) for e in batch if e.commits}) > 1
    assert any(len(c) > 16 for e in batch for c in e.commits)
    return batch


def loss_and_grads(model, loss_fn, batch):
    model.zero_grad(set_to_none=True)
    loss, stats = loss_fn(model, batch)
    loss.backward()
    grads = {name: p.grad.clone() for name, p in model.named_parameters() if p.grad is not None}
    return loss.detach(), stats, grads


def assert_same_step(reference, batched) -> None:
    """Loss, statistics and every gradient of two ``loss_and_grads`` results agree."""
    (ref_loss, ref_stats, ref_grads), (loss, stats, grads) = reference, batched
    assert_close("loss", ref_loss, loss, rtol=1e-5)
    assert stats.tokens == ref_stats.tokens
    assert {k: Counter(v) for k, v in stats.exact.items()} == {k: Counter(v) for k, v in ref_stats.exact.items()}
    assert {k: Counter(v) for k, v in stats.values.items()} == {k: Counter(v) for k, v in ref_stats.values.items()}
    assert grads.keys() == ref_grads.keys()
    for name in ref_grads:
        assert_close(name, ref_grads[name], grads[name])


@pytest.mark.parametrize("slack", [None, 1.5], ids=["one-forward-per-index", "length-groups"])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_batched_loss_and_gradients_equal_the_reference(tiny, seed, slack):
    from memt_demo.batched import batched_episode_loss
    from memt_demo.train import episode_loss

    model, fmt = tiny
    batch = draw_batch(fmt, seed)
    reference = loss_and_grads(model, episode_loss, batch)
    memory_names = [n for n in reference[2] if n.startswith("memt.") and n.endswith(("k_proj.weight", "A_log"))]
    assert memory_names and all(reference[2][n].abs().sum() > 0 for n in memory_names)  # gradients reach the writes
    assert_same_step(reference, loss_and_grads(model, lambda m, b: batched_episode_loss(m, b, slack=slack), batch))


def test_unmasked_padding_would_be_caught(tiny, monkeypatch):
    """The comparison above has teeth: if padded positions wrote into memory, it would fail."""
    from memt_core.models.memory import WriteInputs
    from memt_demo.batched import batched_episode_loss
    from memt_demo.train import episode_loss

    model, fmt = tiny
    batch = draw_batch(fmt, 0)
    reference = loss_and_grads(model, episode_loss, batch)
    monkeypatch.setattr(WriteInputs, "masked", lambda self, mask: self)
    with pytest.raises(AssertionError, match="relative difference"):
        assert_same_step(reference, loss_and_grads(model, lambda m, b: batched_episode_loss(m, b, slack=None), batch))


def test_the_train_loop_takes_the_batched_path(tmp_path, monkeypatch):
    import memt_demo.batched as batched
    from memt_demo.train import TrainConfig, train

    calls = []
    real = batched.batched_episode_loss
    monkeypatch.setattr(batched, "batched_episode_loss", lambda *a, **k: calls.append(1) or real(*a, **k))
    shutil.copytree(BUNDLED_MODEL, tmp_path / "start")
    lines = []
    train(TrainConfig(steps=1, batch_size=2, log_every=1, batched=True), tmp_path / "out", log=lines.append,
          init_from=tmp_path / "start")
    assert calls == [1] and any(line.startswith("step 1/1") for line in lines)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device (CI has none; run on a GPU host)")
def test_batched_on_cuda_equals_the_reference_on_the_cpu(tiny):
    """What a GPU run trains with (``--device cuda --batched``: one forward per commit index) computes the CPU
    reference's loss and gradients; TF32 and other kernels allow a wider tolerance than the CPU's."""
    import copy

    from memt_demo.batched import batched_episode_loss
    from memt_demo.train import episode_loss

    model, fmt = tiny
    batch = draw_batch(fmt, 1)
    reference = loss_and_grads(model, episode_loss, batch)
    gpu = copy.deepcopy(model).to("cuda")
    loss, stats, grads = loss_and_grads(gpu, lambda m, b: batched_episode_loss(m, b, slack="auto"), batch)
    assert loss.device.type == "cuda" and stats.tokens == reference[1].tokens
    assert_close("loss", reference[0], loss.cpu(), rtol=2e-2)
    for name, grad in reference[2].items():
        assert_close(name, grad, grads[name].cpu(), rtol=5e-2)
